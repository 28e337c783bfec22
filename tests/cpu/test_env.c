/* test_env.c: symm_world_config_from_env for each launcher's variables, their
 * precedence, malformed values and SYMM_TIMEOUT. Each test starts from an
 * empty environment and the fixture puts the original one back. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "symm_world.h"
#include "world_fork.h"

extern char **environ;

static char **saved_env;

static void env_save_and_clear(void)
{
    size_t n = 0;
    while (environ[n])
        n++;
    saved_env = calloc(n + 1, sizeof *saved_env);
    for (size_t i = 0; i < n; i++)
        saved_env[i] = strdup(environ[i]);
    clearenv();
}

static void env_restore(void)
{
    wf_cleanup_tempdirs();
    clearenv();
    for (size_t i = 0; saved_env && saved_env[i]; i++) {
        putenv(saved_env[i]); /* the environment keeps the string */
    }
    free(saved_env);
    saved_env = NULL;
}

TestSuite(env, .init = env_save_and_clear, .fini = env_restore);

static void set_int(const char *name, long v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%ld", v);
    setenv(name, buf, 1);
}

static uint32_t rnd(uint32_t below)
{
    uint32_t v;
    wf_random(&v, sizeof v);
    return v % below;
}

/* A random (rank, size, local rank) set under the given names. */
static void set_ranks(const char *rank, const char *size, const char *local, int *r, int *s, int *l)
{
    *s = 2 + (int)rnd(300);
    *r = (int)rnd((uint32_t)*s);
    *l = (int)rnd((uint32_t)*s);
    set_int(rank, *r);
    set_int(size, *s);
    if (local)
        set_int(local, *l);
}

static symm_world_config from_env_ok(void)
{
    symm_world_config cfg;
    memset(&cfg, 0x5a, sizeof cfg);
    symm_status st = symm_world_config_from_env(&cfg);
    cr_assert_eq(st, SYMM_OK, "symm_world_config_from_env: %s", symm_last_error());
    return cfg;
}

static void from_env_fails(const char *needle1, const char *needle2)
{
    symm_world_config cfg = {0};
    symm_status st = symm_world_config_from_env(&cfg);
    cr_assert_eq(st, SYMM_ERR_INVALID_ARG, "expected SYMM_ERR_INVALID_ARG, got %s", symm_status_name(st));
    const char *m = symm_last_error();
    cr_assert(strstr(m, needle1), "message \"%s\" lacks \"%s\"", m, needle1);
    if (needle2)
        cr_assert(strstr(m, needle2), "message \"%s\" lacks \"%s\"", m, needle2);
}

static void check(const symm_world_config *c, int r, int s, int l, const char *job)
{
    cr_assert_eq(c->rank, r);
    cr_assert_eq(c->size, s);
    cr_assert_eq(c->local_rank, l);
    cr_assert_str_eq(c->job_id, job);
}

Test(env, symmrun_variables)
{
    int r, s, l;
    set_ranks("SYMM_RANK", "SYMM_WORLD_SIZE", "SYMM_LOCAL_RANK", &r, &s, &l);
    char job[64], secret[65];
    wf_job_id(job, sizeof job);
    wf_secret(secret);
    setenv("SYMM_JOB_ID", job, 1);
    setenv("SYMM_JOB_SECRET", secret, 1);
    setenv("SYMM_SOCKET_DIR", "/run/somewhere", 1);
    symm_world_config c = from_env_ok();
    check(&c, r, s, l, job);
    cr_assert_str_eq(c.secret, secret);
    cr_assert_str_eq(c.socket_dir, "/run/somewhere");
    cr_assert_eq(c.device, -1, "no SYMM_DEVICE: the device is left to the local rank");
    cr_assert_eq(c.timeout_s, 60.0);
}

Test(env, torchrun_variables_with_master_port)
{
    int r, s, l;
    set_ranks("RANK", "WORLD_SIZE", "LOCAL_RANK", &r, &s, &l);
    setenv("TORCHELASTIC_RUN_ID", "none", 1);
    long port = 20000 + rnd(10000);
    set_int("MASTER_PORT", port);
    char job[64];
    snprintf(job, sizeof job, "none:%ld", port);
    symm_world_config c = from_env_ok();
    check(&c, r, s, l, job);
    cr_assert_null(c.secret, "torchrun sets no secret: it is derived at create");
    cr_assert_null(c.socket_dir);
}

/* A run id that fits alone but not with the port added says so. */
Test(env, torchrun_run_id_too_long_with_its_port_names_both_lengths)
{
    int r, s, l;
    set_ranks("RANK", "WORLD_SIZE", "LOCAL_RANK", &r, &s, &l);
    char id[256];
    const size_t len = 250 + (size_t)rnd(5); /* 250..254: under 255 alone */
    memset(id, 'j', len);
    id[len] = '\0';
    setenv("TORCHELASTIC_RUN_ID", id, 1);
    const long port = 20000 + rnd(10000);
    set_int("MASTER_PORT", port);
    char want[160];
    snprintf(want, sizeof want, "TORCHELASTIC_RUN_ID: %zu characters, and with \":%ld\" added %zu, expected at most 255",
             len, port, len + 6);
    from_env_fails(want, NULL);
}

Test(env, open_mpi_variables)
{
    int r, s, l;
    set_ranks("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", &r, &s, &l);
    setenv("OMPI_MCA_orte_ess_jobid", "3735945217", 1);
    symm_world_config c = from_env_ok();
    check(&c, r, s, l, "3735945217");
    setenv("PMIX_NAMESPACE", "prterun-host-1234@1", 1);
    c = from_env_ok();
    check(&c, r, s, l, "prterun-host-1234@1");
}

Test(env, slurm_variables_with_step)
{
    int r, s, l;
    set_ranks("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", &r, &s, &l);
    long job = 100000 + rnd(900000), step = rnd(50);
    set_int("SLURM_JOB_ID", job);
    char want[64];
    snprintf(want, sizeof want, "%ld", job);
    symm_world_config c = from_env_ok();
    check(&c, r, s, l, want);
    set_int("SLURM_STEP_ID", step);
    snprintf(want, sizeof want, "%ld.%ld", job, step);
    c = from_env_ok();
    check(&c, r, s, l, want);
}

Test(env, missing_local_rank_is_the_rank)
{
    int r, s, l;
    set_ranks("SYMM_RANK", "SYMM_WORLD_SIZE", NULL, &r, &s, &l);
    setenv("SYMM_JOB_ID", "j", 1);
    symm_world_config c = from_env_ok();
    check(&c, r, s, r, "j");
}

Test(env, launchers_take_precedence_in_order)
{
    /* Slurm, then Open MPI, then torchrun, then symmrun: each one added wins. */
    static const char *vars[][3] = {
        {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
        {"RANK", "WORLD_SIZE", "LOCAL_RANK"},
        {"SYMM_RANK", "SYMM_WORLD_SIZE", "SYMM_LOCAL_RANK"},
    };
    static const char *jobs[][2] = {
        {"SLURM_JOB_ID", "slurm-job"},
        {"OMPI_MCA_orte_ess_jobid", "ompi-job"},
        {"TORCHELASTIC_RUN_ID", "torch-job"},
        {"SYMM_JOB_ID", "symm-job"},
    };
    for (int k = 0; k < 4; k++) {
        int r, s, l;
        set_ranks(vars[k][0], vars[k][1], vars[k][2], &r, &s, &l);
        setenv(jobs[k][0], jobs[k][1], 1);
        symm_world_config c = from_env_ok();
        check(&c, r, s, l, jobs[k][1]);
    }
}

Test(env, job_id_precedence_is_independent_of_the_rank_variables)
{
    int r, s, l;
    set_ranks("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", &r, &s, &l);
    setenv("SLURM_JOB_ID", "77", 1);
    setenv("PMIX_NAMESPACE", "pmix-ns", 1);
    symm_world_config c = from_env_ok();
    cr_assert_str_eq(c.job_id, "pmix-ns", "PMIx's namespace comes before Slurm's job id");
    setenv("SYMM_JOB_ID", "mine", 1);
    c = from_env_ok();
    cr_assert_str_eq(c.job_id, "mine", "SYMM_JOB_ID comes first");
}

Test(env, malformed_numbers_name_the_variable_and_value)
{
    static const char *bad_ranks[] = {"3x", "-1", "", " 3", "+2", "99999999999999999999"};
    setenv("SYMM_JOB_ID", "j", 1);
    setenv("SYMM_WORLD_SIZE", "8", 1);
    for (size_t k = 0; k < sizeof bad_ranks / sizeof *bad_ranks; k++) {
        setenv("SYMM_RANK", bad_ranks[k], 1);
        char quoted[64];
        snprintf(quoted, sizeof quoted, "SYMM_RANK: got \"%s\"", bad_ranks[k]);
        from_env_fails(quoted, "expected a rank 0..7");
    }
    setenv("SYMM_RANK", "8", 1);
    from_env_fails("SYMM_RANK: got \"8\"", "expected a rank 0..7 (SYMM_WORLD_SIZE is 8)");
    setenv("SYMM_RANK", "0", 1);
    setenv("SYMM_WORLD_SIZE", "0", 1);
    from_env_fails("SYMM_WORLD_SIZE: got \"0\"", "expected a world size");
    setenv("SYMM_WORLD_SIZE", "4", 1);
    setenv("SYMM_LOCAL_RANK", "4x", 1);
    from_env_fails("SYMM_LOCAL_RANK: got \"4x\"", NULL);
    unsetenv("SYMM_LOCAL_RANK");
    setenv("SYMM_DEVICE", "gpu1", 1);
    from_env_fails("SYMM_DEVICE: got \"gpu1\"", "device ordinal");
    setenv("SYMM_DEVICE", "1", 1);
    cr_assert_eq(from_env_ok().device, 1);
}

Test(env, torchrun_rank_without_size_is_an_error)
{
    setenv("RANK", "1", 1);
    setenv("TORCHELASTIC_RUN_ID", "x", 1);
    from_env_fails("RANK is set (torchrun) but WORLD_SIZE is not", NULL);
}

Test(env, no_launcher_lists_what_is_looked_for)
{
    from_env_fails("no rank in the environment", "SLURM_PROCID");
}

Test(env, no_job_id_lists_what_is_looked_for)
{
    setenv("SYMM_RANK", "0", 1);
    setenv("SYMM_WORLD_SIZE", "2", 1);
    from_env_fails("no job id in the environment", "SYMM_JOB_ID");
    setenv("SYMM_JOB_ID", "", 1);
    from_env_fails("SYMM_JOB_ID is empty", NULL);
}

Test(env, timeout_parses_positive_numbers_and_refuses_the_rest)
{
    setenv("SYMM_RANK", "0", 1);
    setenv("SYMM_WORLD_SIZE", "2", 1);
    setenv("SYMM_JOB_ID", "j", 1);
    double want = 0.5 + rnd(1000) / 10.0;
    char buf[32];
    snprintf(buf, sizeof buf, "%g", want);
    setenv("SYMM_TIMEOUT", buf, 1);
    cr_assert_float_eq(from_env_ok().timeout_s, want, 1e-9);
    static const char *bad[] = {"0", "-1", "abc", "", "nan", "inf", "5s", " 5", "1e9"};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        setenv("SYMM_TIMEOUT", bad[k], 1);
        char quoted[64];
        snprintf(quoted, sizeof quoted, "SYMM_TIMEOUT: got \"%s\"", bad[k]);
        from_env_fails(quoted, "expected a positive number of seconds");
    }
}

Test(env, create_reads_a_malformed_timeout_too)
{
    setenv("SYMM_TIMEOUT", "soon", 1);
    symm_world_config cfg = {.size = 2, .job_id = "j", .device = -1, .socket_dir = "/tmp"};
    symm_world *w;
    cr_assert_eq(symm_world_create(&cfg, &w), SYMM_ERR_INVALID_ARG);
    cr_assert(strstr(symm_last_error(), "symm_world_create: SYMM_TIMEOUT: got \"soon\""), "%s",
              symm_last_error());
}

/* Rank i, its rank already in the environment, joins through the
 * environment alone (sockets in dir, SYMM_TIMEOUT 3) and checks the world
 * with an allgather. */
static int join_from_env(int i, const char *dir, wf_result *res)
{
    setenv("SYMM_TIMEOUT", "3", 1);
    setenv("SYMM_SOCKET_DIR", dir, 1);
    symm_world *w;
    symm_status st = symm_world_create_from_env(&w);
    if (st)
        return wf_failf(res, "create_from_env: %s", symm_last_error());
    int mine = 1000 + i, got[2] = {0, 0};
    st = symm_world_allgather(w, &mine, got, sizeof mine);
    int code = st ? wf_failf(res, "allgather: %s", symm_last_error())
               : got[0] != 1000 || got[1] != 1001 ? wf_failf(res, "allgather gave %d %d", got[0], got[1])
               : symm_world_timeout(w) != 3.0   ? wf_failf(res, "timeout %g", symm_world_timeout(w))
                                                : 0;
    symm_world_destroy(w);
    return code;
}

/* Two forked ranks find each other through the environment alone. */
static int rank_from_env(int i, void *arg, wf_result *res, wf_result *all)
{
    (void)all;
    set_int("SYMM_RANK", i);
    return join_from_env(i, arg, res);
}

Test(env, create_from_env_joins_two_ranks)
{
    char dir[128], job[64], secret[65];
    wf_tempdir(dir, sizeof dir);
    wf_job_id(job, sizeof job);
    wf_secret(secret);
    setenv("SYMM_WORLD_SIZE", "2", 1);
    setenv("SYMM_JOB_ID", job, 1);
    setenv("SYMM_JOB_SECRET", secret, 1);
    wf_result *r = wf_run(2, rank_from_env, dir, 10);
    for (int i = 0; i < 2; i++)
        cr_assert(r[i].done && r[i].code == 0, "rank %d: %s", i, r[i].msg);
    wf_free(r, 2);
    wf_rmtree(dir);
}

/* torch.distributed without torchrun (torch.multiprocessing.spawn, a
 * launcher of one's own) sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
 * but no run id: the address and port name the job. */
Test(env, master_addr_and_port_name_a_job_without_run_id)
{
    int r, s, l;
    set_ranks("RANK", "WORLD_SIZE", "LOCAL_RANK", &r, &s, &l);
    const long port = 20000 + rnd(10000);
    char addr[32], job[64];
    snprintf(addr, sizeof addr, "10.%u.%u.%u", rnd(256), rnd(256), rnd(256));
    snprintf(job, sizeof job, "%s:%ld", addr, port);
    setenv("MASTER_ADDR", addr, 1);
    from_env_fails("no job id in the environment", "MASTER_ADDR and MASTER_PORT");
    set_int("MASTER_PORT", port);
    symm_world_config c = from_env_ok();
    check(&c, r, s, l, job);
    cr_assert_null(c.secret, "no secret: it is derived at create");
    setenv("TORCHELASTIC_RUN_ID", "run7", 1);
    snprintf(job, sizeof job, "run7:%ld", port);
    c = from_env_ok();
    check(&c, r, s, l, job);
}

/* torchrun across nodes (LOCAL_WORLD_SIZE below WORLD_SIZE): rank 0 is at
 * MASTER_ADDR, the rendezvous one port above torch's store, or at
 * SYMM_ROOT_PORT; the local size goes into the config. */
Test(env, torchrun_on_several_hosts_meets_at_master_addr_next_port)
{
    setenv("SYMM_JOB_ID", "j", 1);
    const long local = 2 + rnd(7), hosts = 2 + rnd(3), size = local * hosts;
    set_int("RANK", rnd((uint32_t)size));
    set_int("WORLD_SIZE", size);
    set_int("LOCAL_RANK", rnd((uint32_t)local));
    set_int("LOCAL_WORLD_SIZE", local);
    setenv("MASTER_ADDR", "node01", 1);
    setenv("MASTER_PORT", "29500", 1);
    symm_world_config c = from_env_ok();
    cr_assert_str_eq(c.root_addr, "node01:29501");
    cr_assert_eq(c.local_size, local);
    cr_assert_null(c.host_id);
    setenv("SYMM_ROOT_PORT", "31000", 1);
    c = from_env_ok();
    cr_assert_str_eq(c.root_addr, "node01:31000");
    setenv("MASTER_ADDR", "fd00::1", 1);
    c = from_env_ok();
    cr_assert_str_eq(c.root_addr, "[fd00::1]:31000");
    setenv("SYMM_ROOT_PORT", "0", 1);
    from_env_fails("SYMM_ROOT_PORT: got \"0\"", "expected a TCP port 1..65535");
    unsetenv("SYMM_ROOT_PORT");
    setenv("MASTER_PORT", "65535", 1);
    from_env_fails("MASTER_PORT: got \"65535\"", "or set SYMM_ROOT_PORT");
    unsetenv("MASTER_ADDR");
    char want[160];
    snprintf(want, sizeof want, "the job spans %ld hosts (WORLD_SIZE is %ld, LOCAL_WORLD_SIZE %ld), and "
             "MASTER_ADDR is not set", hosts, size, local);
    from_env_fails(want, "SYMM_ROOT_ADDR");
    /* Uneven: only a lower bound is known. */
    setenv("MASTER_ADDR", "node01", 1);
    setenv("MASTER_PORT", "29500", 1);
    set_int("WORLD_SIZE", size + 1);
    unsetenv("MASTER_ADDR");
    snprintf(want, sizeof want, "the job spans at least %ld hosts", hosts + 1);
    from_env_fails(want, NULL);
    /* Every rank on this host: one host, no root address. */
    setenv("MASTER_ADDR", "node01", 1);
    set_int("LOCAL_WORLD_SIZE", size + 1);
    c = from_env_ok();
    cr_assert_null(c.root_addr);
    cr_assert_eq(c.local_size, size + 1);
    set_int("LOCAL_WORLD_SIZE", size + 2);
    from_env_fails("LOCAL_WORLD_SIZE", "expected 1..");
    setenv("LOCAL_WORLD_SIZE", "0", 1);
    from_env_fails("LOCAL_WORLD_SIZE", "expected 1..");
    set_int("LOCAL_WORLD_SIZE", local);
    set_int("LOCAL_RANK", local);
    from_env_fails("LOCAL_RANK: got", "expected a local rank 0..");
}

/* SYMM_ROOT_ADDR always wins, also over a launcher's own; SYMM_HOST_ID is
 * the host id. */
Test(env, symm_root_addr_wins_and_symm_host_id_is_read)
{
    setenv("SYMM_JOB_ID", "j", 1);
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "4", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    setenv("MASTER_ADDR", "node01", 1);
    setenv("MASTER_PORT", "29500", 1);
    setenv("SYMM_ROOT_ADDR", "10.1.2.3:4567", 1);
    setenv("SYMM_HOST_ID", "rack7-node3", 1);
    symm_world_config c = from_env_ok();
    cr_assert_str_eq(c.root_addr, "10.1.2.3:4567");
    cr_assert_str_eq(c.host_id, "rack7-node3");
    setenv("SYMM_ROOT_ADDR", "", 1);
    from_env_fails("SYMM_ROOT_ADDR is empty", NULL);
    /* symmrun's own variables say the same. */
    clearenv();
    setenv("SYMM_JOB_ID", "j", 1);
    setenv("SYMM_RANK", "3", 1);
    setenv("SYMM_WORLD_SIZE", "4", 1);
    setenv("SYMM_LOCAL_RANK", "1", 1);
    setenv("SYMM_LOCAL_SIZE", "2", 1);
    setenv("SYMM_ROOT_ADDR", "127.0.0.1:4567", 1);
    c = from_env_ok();
    cr_assert_str_eq(c.root_addr, "127.0.0.1:4567");
    cr_assert_eq(c.local_size, 2);
    cr_assert_eq(c.local_rank, 1);
}

/* Open MPI names no rendezvous: across nodes SYMM_ROOT_ADDR is required. */
Test(env, open_mpi_on_several_hosts_needs_symm_root_addr)
{
    setenv("OMPI_COMM_WORLD_RANK", "5", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
    setenv("PMIX_NAMESPACE", "ns", 1);
    from_env_fails("the job spans 2 hosts (OMPI_COMM_WORLD_SIZE is 8, OMPI_COMM_WORLD_LOCAL_SIZE 4)",
                   "set SYMM_ROOT_ADDR=host:port");
    setenv("SYMM_ROOT_ADDR", "node01:29600", 1);
    symm_world_config c = from_env_ok();
    cr_assert_str_eq(c.root_addr, "node01:29600");
    cr_assert_eq(c.local_size, 4);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "8", 1);
    unsetenv("SYMM_ROOT_ADDR");
    c = from_env_ok();
    cr_assert_null(c.root_addr);
}

/* Slurm across nodes: the first host of the step's node list (else the
 * job's), a port derived from the job and step ids unless SYMM_ROOT_PORT. */
Test(env, slurm_on_several_nodes_meets_at_the_first_node)
{
    int r, s, l;
    set_ranks("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", &r, &s, &l);
    setenv("SLURM_JOB_ID", "77", 1);
    setenv("SLURM_STEP_ID", "3", 1);
    const long nodes = 2 + rnd(30);
    set_int("SLURM_NNODES", nodes);
    setenv("SLURM_JOB_NODELIST", "gpu[01-04,07],login1", 1);
    symm_world_config c = from_env_ok();
    char want[64];
    snprintf(want, sizeof want, "gpu01:%d", 20000 + (77 * 97 + 3) % 12000);
    cr_assert_str_eq(c.root_addr, want);
    cr_assert_str_eq(c.job_id, "77.3");
    setenv("SLURM_STEP_NODELIST", "rack[2-3]-n[08-09]", 1);
    setenv("SYMM_ROOT_PORT", "29999", 1);
    c = from_env_ok();
    cr_assert_str_eq(c.root_addr, "rack2-n08:29999");
    /* A step on one node of a larger allocation: one host. */
    setenv("SLURM_STEP_NUM_NODES", "1", 1);
    c = from_env_ok();
    cr_assert_null(c.root_addr);
    set_int("SLURM_STEP_NUM_NODES", nodes);
    setenv("SLURM_STEP_NODELIST", "gpu[01-", 1);
    from_env_fails("SLURM_STEP_NODELIST: got \"gpu[01-\"", "expected a Slurm hostlist");
    unsetenv("SLURM_STEP_NODELIST");
    unsetenv("SLURM_JOB_NODELIST");
    from_env_fails("neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST", "SYMM_ROOT_ADDR");
    setenv("SLURM_STEP_NUM_NODES", "two", 1);
    from_env_fails("SLURM_STEP_NUM_NODES: got \"two\"", "expected a number of hosts");
}

/* A torchrun job on two simulated hosts joins through the environment
 * alone: SYMM_HOST_ID per host, a socket directory each, MASTER_ADDR. */
typedef struct two_hosts {
    char dir[128];
    int master_port;
} two_hosts;

static int rank_of_two_hosts(int i, void *arg, wf_result *res, wf_result *all)
{
    (void)all;
    const two_hosts *t = arg;
    char sub[160], host[16];
    snprintf(sub, sizeof sub, "%s/h%d", t->dir, i / 2);
    snprintf(host, sizeof host, "sim%d", i / 2);
    mkdir(sub, 0700);
    setenv("SYMM_SOCKET_DIR", sub, 1);
    setenv("SYMM_HOST_ID", host, 1);
    set_int("RANK", i);
    set_int("LOCAL_RANK", i % 2);
    set_int("MASTER_PORT", t->master_port);
    symm_world *w = NULL;
    symm_status st = symm_world_create_from_env(&w);
    if (st)
        return wf_failf(res, "create_from_env: %s", symm_last_error());
    int mine = 1000 + i, got[4] = {0};
    st = symm_world_allgather(w, &mine, got, sizeof mine);
    int code = st ? wf_failf(res, "allgather: %s", symm_last_error())
               : got[3] != 1003 ? wf_failf(res, "allgather gave %d", got[3])
               : symm_world_host_count(w) != 2 || symm_world_host(w) != i / 2 ||
                         symm_world_size(symm_world_host_world(w)) != 2
                   ? wf_failf(res, "hosts %d host %d", symm_world_host_count(w), symm_world_host(w))
                   : 0;
    symm_world_destroy(w);
    return code;
}

Test(env, create_from_env_joins_a_torchrun_job_on_two_hosts)
{
    two_hosts t;
    wf_tempdir(t.dir, sizeof t.dir);
    t.master_port = wf_free_port() - 1; /* the rendezvous takes MASTER_PORT + 1 */
    setenv("WORLD_SIZE", "4", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("TORCHELASTIC_RUN_ID", "run", 1);
    setenv("SYMM_JOB_SECRET", "s3cret", 1);
    setenv("SYMM_TIMEOUT", "5", 1);
    wf_result *r = wf_run(4, rank_of_two_hosts, &t, 20);
    for (int i = 0; i < 4; i++)
        cr_assert(r[i].done && r[i].code == 0, "rank %d: %s", i, r[i].msg);
    wf_free(r, 4);
    wf_rmtree(t.dir);
}

/* Two ranks as torch.multiprocessing.spawn starts them (RANK, WORLD_SIZE,
 * MASTER_ADDR, MASTER_PORT, nothing else) form a world. */
static int rank_from_torch_env(int i, void *arg, wf_result *res, wf_result *all)
{
    (void)all;
    set_int("RANK", i);
    return join_from_env(i, arg, res);
}

Test(env, create_from_env_joins_two_spawned_torch_ranks)
{
    char dir[128];
    wf_tempdir(dir, sizeof dir);
    setenv("WORLD_SIZE", "2", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    set_int("MASTER_PORT", 20000 + rnd(40000));
    wf_result *r = wf_run(2, rank_from_torch_env, dir, 10);
    for (int i = 0; i < 2; i++)
        cr_assert(r[i].done && r[i].code == 0, "rank %d: %s", i, r[i].msg);
    wf_free(r, 2);
    wf_rmtree(dir);
}
