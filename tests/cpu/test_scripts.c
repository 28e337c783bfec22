/* test_scripts.c: the parts of the GPU scripts that run without a GPU.
 * scripts/bench-tune.sh --rounds: the runs' order (the list in odd rounds,
 * reversed in even ones), and its refusal of a bad count;
 * scripts/ab-table.sh: the means of the ab step's rounds;
 * scripts/test-gpu.sh: its refusal of unknown parts and worlds
 * (SYMM_TEST_PARTS, SYMM_TEST_WORLDS), which comes before it looks for a
 * GPU (the values it accepts would start the GPU tests on a GPU host, so
 * they are not run here); scripts/test-python-gpu.sh: its refusal of a
 * world outside 2..8 (SYMM_TEST_PY_WORLD) and of a stack-dump time that
 * is not whole seconds (SYMM_TEST_PY_STACKS), before anything else;
 * scripts/device-run.sh's RUN_BUDGET and its spans, ab, bench-check and
 * bench-sanitize steps (on a fake machine: a fake nvidia-smi on PATH, fake
 * build binaries);
 * bench/link_probe's kernels (link_probe_kernels.h), which NVRTC compiles
 * only on a GPU host at run time, compile here without a warning. Run from
 * the repository root, as make test does. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "symm_jit.h"
#include "world_fork.h"

#include "../../bench/link_probe_kernels.h"

/* The kernels link_probe looks up by name. */
static const char *const kernels[] = {"tma_copy",   "tma_spread", "lsu_copy", "lsu_spread", "lsu_sum",
                                      "lsu_load",   "lsu_load16", "lsu_load24", "tma_load", "lsu_store",
                                      "xchg_flag", "xchg_line"};

/* Runs `command` through the shell; its stdout and stderr in out. */
static int run(const char *command, char *out, size_t size)
{
    char line[512];
    snprintf(line, sizeof line, "%s 2>&1", command);
    FILE *p = popen(line, "r");
    cr_assert_not_null(p, "popen(%s)", line);
    size_t n = fread(out, 1, size - 1, p);
    out[n] = '\0';
    const int status = pclose(p);
    cr_assert(WIFEXITED(status), "%s: did not exit", command);
    return WEXITSTATUS(status);
}

/* `command` must exit 2 with `want` in its output (kept in out). */
static void expect_refused(const char *command, const char *want, char *out, size_t size)
{
    const int rc = run(command, out, size);
    cr_assert_eq(rc, 2, "%s: exit status %d: %s", command, rc, out);
    cr_assert(strstr(out, want), "%s: %s", command, out);
}

Test(bench_tune, rounds_take_the_list_in_order_then_reversed)
{
    char out[4096];
    const int rc = run("scripts/bench-tune.sh --dry-run --rounds 3 default X=1 \"\"", out, sizeof out);
    cr_assert_eq(rc, 0, "exit status %d: %s", rc, out);
    cr_assert_str_eq(out, "run 0: round 1, tuning default\n"
                          "run 1: round 1, tuning X=1\n"
                          "run 2: round 1, tuning default\n"
                          "run 3: round 2, tuning default\n"
                          "run 4: round 2, tuning X=1\n"
                          "run 5: round 2, tuning default\n"
                          "run 6: round 3, tuning default\n"
                          "run 7: round 3, tuning X=1\n"
                          "run 8: round 3, tuning default\n");
    /* Two tunings: A B, B A (ABBA). */
    cr_assert_eq(run("scripts/bench-tune.sh --dry-run --rounds 2 A=1 B=2", out, sizeof out), 0, "%s", out);
    cr_assert_str_eq(out, "run 0: round 1, tuning A=1\n"
                          "run 1: round 1, tuning B=2\n"
                          "run 2: round 2, tuning B=2\n"
                          "run 3: round 2, tuning A=1\n");
    /* One round by default. */
    cr_assert_eq(run("scripts/bench-tune.sh --dry-run A=1 B=2", out, sizeof out), 0, "%s", out);
    cr_assert_str_eq(out, "run 0: round 1, tuning A=1\nrun 1: round 1, tuning B=2\n");
}

Test(bench_tune, refuses_a_round_count_outside_1_to_20)
{
    const char *bad[] = {"0", "21", "x", "-1", "2x", "\"\""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char command[128], out[1024];
        snprintf(command, sizeof command, "scripts/bench-tune.sh --dry-run --rounds %s A=1", bad[i]);
        expect_refused(command, "expected an integer 1..20", out, sizeof out);
    }
    char out[1024];
    cr_assert_eq(run("scripts/bench-tune.sh --dry-run --rounds", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "--rounds needs a value"), "%s", out);
}

/* A log of moe_bench as the ab step keeps it: a row's line with its
 * dispatch and combine p50/p90 (the 6th and 7th fields), among others. */
static void write_log(const char *dir, const char *name, double d1, double c1, double d2, double c2)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fprintf(f, "[0] moe_bench: 2 ranks, 2 variants\n"
               "[0]     row g.decode   T=128   dispatch     %.1f us\n"
               "[0] row          variant                      T     sms  dispatch us p50/p90\n"
               "[0] g.decode     bench_dsv3_decode_expert     128   24   %.1f/%.1f          %.1f/%.1f   7.16\n"
               "[0] g.prefill    bench_dsv3_prefill_expert    4096  24   %.1f/%.1f          %.1f/%.1f   234.49\n"
               "[1] g.decode     bench_dsv3_decode_expert     128   24   99.0/99.0          99.0/99.0   7.16\n",
            d1, d1, d1 + 0.2, c1, c1 + 0.2, d2, d2 + 3, c2, c2 + 3);
    fclose(f);
}

Test(ab_table, gives_each_row_s_mean_p50_a_side_and_the_difference)
{
    char dir[] = "/tmp/symm-ab-table.XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    write_log(dir, "ab-new-1.log", 32.5, 31.0, 400.0, 580.0);
    write_log(dir, "ab-old-1.log", 34.0, 32.0, 402.0, 590.0);
    write_log(dir, "ab-old-2.log", 33.0, 33.0, 404.0, 600.0);
    write_log(dir, "ab-new-2.log", 32.9, 32.0, 406.0, 590.0);
    char command[256], out[8192];
    snprintf(command, sizeof command, "scripts/ab-table.sh %s abc123", dir);
    const int rc = run(command, out, sizeof out);
    cr_assert_eq(rc, 0, "exit status %d: %s", rc, out);
    cr_assert(strstr(out, "ab-new-1:\n  g.decode 32.5/32.7 / 31.0/31.2\n  g.prefill 400.0/403.0 / 580.0/583.0\n"),
              "the runs' rows: %s", out);
    cr_assert(strstr(out, "| g.decode | 2/2 | 32.70 | 33.50 | -0.80 | 31.50 | 32.50 | -1.00 |\n"), "%s", out);
    cr_assert(strstr(out, "| g.prefill | 2/2 | 403.00 | 403.00 | +0.00 | 585.00 | 595.00 | -10.00 |\n"), "%s", out);
    cr_assert(strstr(out, "old: abc123"), "%s", out);
    cr_assert(!strstr(out, "99.0"), "another rank's line was read: %s", out);
    /* A directory without logs, and bad usage. */
    char empty[] = "/tmp/symm-ab-empty.XXXXXX";
    cr_assert_not_null(mkdtemp(empty));
    snprintf(command, sizeof command, "scripts/ab-table.sh %s abc123", empty);
    cr_assert_eq(run(command, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "no ab-new-*.log or ab-old-*.log"), "%s", out);
    cr_assert_eq(run("scripts/ab-table.sh", out, sizeof out), 2, "%s", out);
    const char *names[] = {"ab-new-1.log", "ab-old-1.log", "ab-old-2.log", "ab-new-2.log"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
    rmdir(empty);
}

Test(test_gpu, refuses_unknown_parts_and_worlds_naming_what_it_takes)
{
    const struct {
        const char *env, *want;
    } bad[] = {
        {"SYMM_TEST_PARTS=bogus", "SYMM_TEST_PARTS: unknown part bogus (expected some of: runtime matrix hosts tunings)"},
        {"SYMM_TEST_PARTS='matrix tuning'", "SYMM_TEST_PARTS: unknown part tuning"},
        {"SYMM_TEST_WORLDS=2,9", "SYMM_TEST_WORLDS: 9 is not a world of 1 to 8 ranks"},
        {"SYMM_TEST_WORLDS=0", "SYMM_TEST_WORLDS: 0 is not a world of 1 to 8 ranks"},
        {"SYMM_TEST_WORLDS=four", "SYMM_TEST_WORLDS: four is not a world of 1 to 8 ranks"},
        {"NCCL_SHARED_MAX=eight", "NCCL_SHARED_MAX: expected a world (a whole number of ranks), got 'eight'"},
        {"NCCL_SHARED_MAX=", "NCCL_SHARED_MAX: expected a world (a whole number of ranks), got ''"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char command[256], out[1024];
        snprintf(command, sizeof command, "env %s scripts/test-gpu.sh", bad[i].env);
        expect_refused(command, bad[i].want, out, sizeof out);
        cr_assert(!strstr(out, "skipped"), "%s: refused before the GPU check: %s", bad[i].env, out);
    }
}

Test(test_python_gpu, refuses_a_world_outside_2_to_8_before_anything_else)
{
    const char *bad[] = {"1", "9", "0", "two", "2,4"}; /* empty: the default, 2 */
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char command[256], out[1024];
        snprintf(command, sizeof command, "env SYMM_TEST_PY_WORLD=%s scripts/test-python-gpu.sh", bad[i]);
        expect_refused(command, "expected 2 to 8 ranks", out, sizeof out);
    }
}

Test(test_python_gpu, refuses_a_stack_dump_time_that_is_not_whole_seconds)
{
    const char *bad[] = {"0", "-5", "2m", "1.5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char command[256], out[1024];
        snprintf(command, sizeof command, "env SYMM_TEST_PY_STACKS=%s scripts/test-python-gpu.sh", bad[i]);
        expect_refused(command, "expected whole seconds above 0", out, sizeof out);
    }
}

Test(device_run, refuses_a_run_budget_that_is_not_whole_seconds)
{
    char out[1024];
    expect_refused("env RUN_BUDGET=10s OUT=/tmp scripts/device-run.sh build probe",
                   "RUN_BUDGET must be whole seconds, got '10s'", out, sizeof out);
}

/* A fake GPU machine under dir (made by mkdtemp) for device-run.sh:
 * dir/path/nvidia-smi names `gpus` GPUs, dir/build/bin/symmgen does
 * nothing and dir/build/bin/symmrun runs `symmrun_body` (sh); OUT is
 * dir/out. */
static void fake_machine(const char *dir, int gpus, const char *symmrun_body)
{
    char command[1024], out[4096];
    snprintf(command, sizeof command,
             "d=%s; mkdir -p $d/build/bin $d/path $d/out && "
             "printf '#!/bin/sh\\nfor i in $(seq 0 %d); do echo \"GPU $i: fake\"; done\\n' > $d/path/nvidia-smi && "
             "printf '#!/bin/sh\\nexit 0\\n' > $d/build/bin/symmgen && "
             "printf '#!/bin/sh\\n%%s\\n' '%s' > $d/build/bin/symmrun && "
             "chmod +x $d/path/nvidia-smi $d/build/bin/symmgen $d/build/bin/symmrun",
             dir, gpus - 1, symmrun_body);
    cr_assert_eq(run(command, out, sizeof out), 0, "%s", out);
}

/* A fake machine of `gpus` GPUs whose symmrun prints what it was given,
 * and in env the DEVICE_GPUS setting that leaves `used` of them (0: none,
 * all of them). */
static void echo_machine(const char *dir, int gpus, int used, char *env, size_t size)
{
    fake_machine(dir, gpus, "echo symmrun \"$*\"");
    env[0] = '\0';
    if (used)
        snprintf(env, size, "DEVICE_GPUS=%d", used);
}

/* What echo_machine's symmrun prints when a step runs a rank on each of
 * its first n GPUs (2 or 4). */
static void symmrun_ranks(char *want, size_t size, int n)
{
    snprintf(want, size, "symmrun -n %d --gpus %s ", n, n == 2 ? "0,1" : "0,1,2,3");
}

/* DEVICE_GPUS must name from 1 to the machine's GPUs (a fake machine of 2). */
Test(device_run, refuses_device_gpus_outside_1_to_the_machine_s_gpus)
{
    char dir[64];
    wf_tempdir(dir, sizeof dir);
    cr_assert(dir[0], "no temporary directory");
    char command[1024], out[4096];
    fake_machine(dir, 2, "exit 0");
    const struct {
        const char *value, *want;
    } cases[] = {{"3", "DEVICE_GPUS=3 but the machine has 2 GPUs"},
                 {"0", "DEVICE_GPUS must be a whole number of GPUs from 1, got '0'"},
                 {"two", "DEVICE_GPUS must be a whole number of GPUs from 1, got 'two'"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        snprintf(command, sizeof command, "env PATH=%s/path:$PATH DEVICE_GPUS=%s OUT=%s/out scripts/device-run.sh %s/build probe",
                 dir, cases[c].value, dir, dir);
        expect_refused(command, cases[c].want, out, sizeof out);
    }
    wf_rmtree(dir);
}

/* scripts/gpus.sh's gpu_count, which every GPU script counts with: the
 * GPUs nvidia-smi names, or the first DEVICE_GPUS of them (a fake machine
 * of 4). */
Test(gpus, gpu_count_is_the_machine_s_gpus_or_device_gpus_of_them)
{
    char dir[64];
    wf_tempdir(dir, sizeof dir);
    cr_assert(dir[0], "no temporary directory");
    char command[1024], out[4096];
    fake_machine(dir, 4, "exit 0");
    snprintf(command, sizeof command,
             "env PATH=%s/path:$PATH bash -c '. scripts/gpus.sh; gpu_count; DEVICE_GPUS=2 gpu_count'", dir);
    cr_assert_eq(run(command, out, sizeof out), 0, "%s", out);
    cr_assert_str_eq(out, "4\n2\n");
    wf_rmtree(dir);
}

/* RUN_BUDGET cuts a step's limit to what is left and skips the steps that
 * find too little, so the summary and the logs always come back. On a fake
 * machine (fake_machine) with one GPU, whose symmrun (the probe step's
 * launcher) would sleep for a minute. */
Test(device_run, run_budget_cuts_a_step_and_skips_the_next_and_the_logs_come_back)
{
    char dir[64];
    wf_tempdir(dir, sizeof dir);
    cr_assert(dir[0], "no temporary directory");
    char command[1024], out[8192];
    fake_machine(dir, 1, "sleep 60");
    snprintf(command, sizeof command,
             "d=%s; t0=$(date +%%s); env PATH=$d/path:$PATH RUN_BUDGET=16 OUT=$d/out "
             "scripts/device-run.sh $d/build probe probe; echo \"rc=$? took=$(( $(date +%%s) - t0 ))\"",
             dir);
    cr_assert_eq(run(command, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "link_probe                   rc=124"), "the first probe cut and stopped: %s", out);
    cr_assert(strstr(out, "link_probe                   skipped: RUN_BUDGET (16 s) spent"), "the second skipped: %s",
              out);
    const char *took = strstr(out, "took=");
    cr_assert_not_null(took, "%s", out);
    cr_assert_lt(atoi(took + 5), 15, "the invocation outlived its budget: %s", out);
    snprintf(command, sizeof command, "test -s %s/out/summary.log && tar -tzf %s/out/logs.tgz", dir, dir);
    cr_assert_eq(run(command, out, sizeof out), 0, "summary.log and logs.tgz under OUT: %s", out);
    cr_assert(strstr(out, "link_probe.log"), "%s", out);
    wf_rmtree(dir);
}

/* The commit a bench step's RESULTS entry names (BENCH_COMMIT, which
 * scripts/bench.sh reads): as given, else BUILD_DIR/COMMIT (what `make
 * gpu-build` wrote where the binaries were built; only the characters a
 * commit name has), else unset (bench.sh asks git). On a fake machine whose
 * symmrun (the probe step's launcher) prints it. */
Test(device_run, bench_commit_comes_from_the_build_s_commit_file)
{
    char dir[64];
    wf_tempdir(dir, sizeof dir);
    cr_assert(dir[0], "no temporary directory");
    char command[1024], out[8192];
    fake_machine(dir, 1, "echo commit=${BENCH_COMMIT:-unset} passed"); /* the summary shows a passed line */
    const struct {
        const char *file, *given, *want;
    } cases[] = {{"abc1234+dirty", NULL, "commit=abc1234+dirty"},
                 {"abc1234", "f00d123", "commit=f00d123"},
                 {"ab;c 12$(x)34", NULL, "commit=abc12x34"},
                 {NULL, NULL, "commit=unset"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        if (cases[c].file)
            snprintf(command, sizeof command, "printf '%%s\\n' '%s' > %s/build/COMMIT", cases[c].file, dir);
        else
            snprintf(command, sizeof command, "rm -f %s/build/COMMIT", dir);
        cr_assert_eq(run(command, out, sizeof out), 0, "%s", out);
        snprintf(command, sizeof command, "env PATH=%s/path:$PATH %s%s OUT=%s/out scripts/device-run.sh %s/build probe",
                 dir, cases[c].given ? "BENCH_COMMIT=" : "", cases[c].given ? cases[c].given : "", dir, dir);
        cr_assert_eq(run(command, out, sizeof out), 0, "%s", out);
        cr_assert(strstr(out, cases[c].want), "COMMIT %s, BENCH_COMMIT %s: want %s in %s",
                  cases[c].file ? cases[c].file : "(none)", cases[c].given ? cases[c].given : "(unset)", cases[c].want,
                  out);
    }
    wf_rmtree(dir);
}

/* The spans step: moe_bench --profile=2 --no-nccl on rows PROFILE_GROUPS
 * (default g,a,b), a rank per GPU, the bench spec at the host's world, its
 * log in OUT's spans.log. On a fake machine with 2 and with 4 GPUs, whose
 * symmrun prints what it was given. */
Test(device_run, spans_runs_moe_bench_at_profile_2_a_rank_per_gpu)
{
    char dir[64];
    wf_tempdir(dir, sizeof dir);
    cr_assert(dir[0], "no temporary directory");
    char command[1024], out[8192];
    const struct {
        int gpus, used; /* the machine's GPUs, those DEVICE_GPUS leaves (0: unset) */
        const char *groups, *want_groups, *manifest;
    } cases[] = {{2, 0, NULL, "--groups g,a,b", "--manifest out/bench/manifest.json"},
                 {4, 0, "g", "--groups g ", "--manifest out/bench-w4/manifest.json"},
                 {4, 2, NULL, "--groups g,a,b", "--manifest out/bench/manifest.json"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char used[32];
        echo_machine(dir, cases[c].gpus, cases[c].used, used, sizeof used);
        snprintf(command, sizeof command,
                 "d=%s; rm -f $d/out/spans.log && "
                 "env PATH=$d/path:$PATH OUT=$d/out %s %s%s scripts/device-run.sh $d/build spans && "
                 "cat $d/out/spans.log",
                 dir, used, cases[c].groups ? "PROFILE_GROUPS=" : "", cases[c].groups ? cases[c].groups : "");
        cr_assert_eq(run(command, out, sizeof out), 0, "%s", out);
        char ranks[64];
        symmrun_ranks(ranks, sizeof ranks, cases[c].used ? cases[c].used : cases[c].gpus);
        const char *want[] = {ranks, "bench/moe_bench", "--profile=2", "--no-nccl", cases[c].want_groups,
                              cases[c].manifest};
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
            cr_assert(strstr(out, want[i]), "%d GPUs: no \"%s\" in: %s", cases[c].gpus, want[i], out);
    }
    wf_rmtree(dir);
}

/* The ab step: this tree's bench kernels and those ab-prepare.sh left in
 * BUILD/ab, alternated, a rank per GPU at the host's world: world 2's
 * spec at 2 GPUs, the spec at world W (bench-wW) at W; without BUILD/ab's
 * kernels of that world it says so and runs nothing. On a fake machine
 * whose symmrun prints what it was given. */
Test(device_run, ab_runs_both_sides_at_the_host_s_world)
{
    char dir[64];
    wf_tempdir(dir, sizeof dir);
    cr_assert(dir[0], "no temporary directory");
    char command[1024], out[16384];
    const struct {
        int gpus, used; /* the machine's GPUs, those DEVICE_GPUS leaves (0: unset) */
        const char *prepared, *new_manifest, *old_manifest;
    } cases[] = {{2, 0, "bench", "out/bench/manifest.json", "build/ab/bench/manifest.json"},
                 {4, 0, "bench-w4", "out/bench-w4/manifest.json", "build/ab/bench-w4/manifest.json"},
                 {4, 2, "bench", "out/bench/manifest.json", "build/ab/bench/manifest.json"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char used[32];
        echo_machine(dir, cases[c].gpus, cases[c].used, used, sizeof used);
        /* Nothing prepared: refused by name, no run. */
        snprintf(command, sizeof command,
                 "d=%s; rm -rf $d/build/ab && env PATH=$d/path:$PATH OUT=$d/out %s scripts/device-run.sh $d/build ab",
                 dir, used);
        cr_assert_eq(run(command, out, sizeof out), 0, "%s", out);
        char want[256];
        snprintf(want, sizeof want, "ab: no %s/%s (run scripts/ab-prepare.sh REV before the call)", dir,
                 cases[c].old_manifest);
        cr_assert(strstr(out, want), "%d GPUs: no \"%s\" in: %s", cases[c].gpus, want, out);
        cr_assert(!strstr(out, "ab-new-1"), "%d GPUs: ran without the old kernels: %s", cases[c].gpus, out);
        /* Prepared: two rounds, each side once a round, every run at the world. */
        snprintf(command, sizeof command,
                 "d=%s; mkdir -p $d/build/ab/%s && touch $d/build/ab/%s/manifest.json && echo abc1234 > $d/build/ab/REV && "
                 "env PATH=$d/path:$PATH OUT=$d/out %s scripts/device-run.sh $d/build ab && "
                 "cd $d/out && tar xzf logs.tgz && cat ab-new-1.log ab-old-1.log ab-old-2.log ab-new-2.log ab.md",
                 dir, cases[c].prepared, cases[c].prepared, used);
        cr_assert_eq(run(command, out, sizeof out), 0, "%s", out);
        const int n = cases[c].used ? cases[c].used : cases[c].gpus;
        char ranks[64], new_m[256], old_m[256], world[64];
        symmrun_ranks(ranks, sizeof ranks, n);
        snprintf(new_m, sizeof new_m, "--manifest %s ", cases[c].new_manifest);
        snprintf(old_m, sizeof old_m, "--manifest %s/%s ", dir, cases[c].old_manifest);
        snprintf(world, sizeof world, "rows g at world %d,", n);
        const char *wants[] = {ranks, new_m, old_m, "--groups g ", "--no-nccl", world, "against abc1234 (old)"};
        for (size_t i = 0; i < sizeof wants / sizeof wants[0]; i++)
            cr_assert(strstr(out, wants[i]), "%d GPUs: no \"%s\" in: %s", cases[c].gpus, wants[i], out);
        int runs = 0;
        for (const char *p = out; (p = strstr(p, "symmrun -n")); p++)
            runs++;
        cr_assert_eq(runs, 4, "%d GPUs: %d runs, want 4 (two rounds, each side once): %s", cases[c].gpus, runs, out);
    }
    wf_rmtree(dir);
}

/* The ncu step: for every row of NCU_ROWS and kernel of NCU_KERNELS, one
 * moe_bench run of that row alone through scripts/ncu-rank.sh, a rank per
 * GPU, the kernels compiled with a line table, prefill's rows sampled less
 * often than decode's; the pages of the reports come back in ncu.tgz. On a
 * fake machine whose symmrun prints what it was given and the settings. */
Test(device_run, ncu_profiles_rank_0_a_row_and_kernel_at_a_time)
{
    char dir[64];
    wf_tempdir(dir, sizeof dir);
    cr_assert(dir[0], "no temporary directory");
    char command[1024], out[16384];
    fake_machine(dir, 2,
                 "echo symmrun \"$*\" kernel=$NCU_KERNEL interval=$NCU_INTERVAL lineinfo=$SYMM_JIT_LINEINFO "
                 "sources=$NCU_SOURCES");
    snprintf(command, sizeof command,
             "d=%s; env PATH=$d/path:$PATH OUT=$d/out NCU_ROWS=g.prefill,b NCU_KERNELS='combine dispatch' "
             "scripts/device-run.sh $d/build ncu && cd $d/out && test -f ncu.tgz && tar xzf logs.tgz && "
             "cat ncu-g.prefill-combine.log ncu-g.prefill-dispatch.log ncu-b-combine.log ncu-b-dispatch.log",
             dir);
    cr_assert_eq(run(command, out, sizeof out), 0, "%s", out);
    char ranks[64];
    symmrun_ranks(ranks, sizeof ranks, 2);
    const char *wants[] = {ranks,
                           "-- scripts/ncu-rank.sh ",
                           "bench/moe_bench --manifest out/bench/manifest.json --rows g.prefill --no-nccl",
                           "--rows b --no-nccl",
                           "kernel=symm_combine interval=3 lineinfo=1 sources=out/bench",
                           "kernel=symm_dispatch interval=3",
                           "kernel=symm_combine interval=0",
                           "kernel=symm_dispatch interval=0"};
    for (size_t i = 0; i < sizeof wants / sizeof wants[0]; i++)
        cr_assert(strstr(out, wants[i]), "no \"%s\" in: %s", wants[i], out);
    wf_rmtree(dir);
}

/* scripts/ncu-lines.py: the samples of ncu's source page by template line,
 * from the disassembly of the function whose instructions are the CSV's
 * (not the first function of the file); refused with 1 when none matches,
 * with 2 when the CSV has no stall reason by name. */
static void write_text(const char *dir, const char *name, const char *text)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert(f && fputs(text, f) >= 0 && fclose(f) == 0, "cannot write %s", path);
}

Test(ncu_lines, samples_by_line_from_the_matching_function)
{
    char dir[64];
    wf_tempdir(dir, sizeof dir);
    cr_assert(dir[0], "no temporary directory");
    char command[512], out[8192];
    write_text(dir, "k.csv",
               "\"Kernel Name\",\"symm_combine\",\n"
               "\"Address\",\"Source\",\"smsp__pcsamp_warps_issue_stalled_long_scoreboard\","
               "\"smsp__pcsamp_warps_issue_stalled_wait\"\n"
               "\"0x7f00\",\"  LDG.E.128 R4, desc[UR6][R2.64]\",\"1\",\"0\"\n"
               "\"0x7f10\",\"  @P0 IMAD.U32 R7, R4, 0x10000, RZ\",\"70\",\"2\"\n"
               "\"0x7f20\",\"  EXIT\",\"0\",\"27\"\n");
    write_text(dir, "g.csv",
               "\"Kernel Name\",\"symm_combine\",\n"
               "\"Address\",\"Source\",\"group:smsp__pcsamp_warp_stall_reasons\"\n"
               "\"0x7f00\",\"  LDG.E.128 R4, desc[UR6][R2.64]\",\"1\"\n");
    const char *combine = ".text.symm_combine:\n"
                          "\t//## File \"/x/templates/cu/combine_sums.cu.in\", line 525\n"
                          "        /*0000*/                   LDG.E.128 R4, desc[UR6][R2.64] ;\n"
                          "\t//## File \"/x/templates/cu/primitives.cu.in\", line 448\n"
                          "        /*0010*/              @P0 IMAD.U32 R7, R4, 0x10000, RZ ;\n"
                          "\t//## File \"/x/templates/cu/combine.cu.in\", line 39\n";
    char text[1024];
    snprintf(text, sizeof text,
             ".text.symm_dispatch:\n        /*0000*/  LDG.E.128 R4, desc[UR6][R2.64] ;\n        /*0010*/  EXIT ;\n"
             "%s        /*0020*/                   EXIT ;\n",
             combine);
    write_text(dir, "k.sass", text);
    write_text(dir, "short.sass", combine); /* no EXIT: two instructions */
    snprintf(command, sizeof command, "python3 scripts/ncu-lines.py %s/k.csv --sass %s/k.sass --hot 1 --context 1",
             dir, dir);
    cr_assert_eq(run(command, out, sizeof out), 0, "%s", out);
    const char *wants[] = {"kernel symm_combine: 3 instructions, 100 samples",
                           "long_scoreboard           71  71.0%",
                           "wait                      29  29.0%",
                           "       72  72.0%  primitives.cu.in:448  (long_scoreboard 97%, wait 3%)",
                           "       27  27.0%  combine.cu.in:39  (wait 100%)",
                           "-- 72 samples (long_scoreboard 97%, wait 3%) at 0010, primitives.cu.in:448",
                           "=> 0010     72  @P0 IMAD.U32 R7, R4, 0x10000, RZ"};
    for (size_t i = 0; i < sizeof wants / sizeof wants[0]; i++)
        cr_assert(strstr(out, wants[i]), "no \"%s\" in: %s", wants[i], out);
    /* A disassembly without the CSV's instructions: 1. */
    snprintf(command, sizeof command, "python3 scripts/ncu-lines.py %s/k.csv --sass %s/short.sass", dir, dir);
    cr_assert_eq(run(command, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "has the 3 instructions of"), "%s", out);
    /* A CSV of ncu's groups, not the reasons by name: 2. */
    snprintf(command, sizeof command, "python3 scripts/ncu-lines.py %s/g.csv --sass %s/k.sass", dir, dir);
    expect_refused(command, "no smsp__pcsamp_warps_issue_stalled_* column", out, sizeof out);
    wf_rmtree(dir);
}

/* moe_bench --rows: exactly the rows named (with --groups, those both
 * select), and an id that names no row, or an empty entry, refused by name
 * (--plan: no GPU). */
Test(bench, rows_selects_rows_by_id)
{
    char dir[64];
    wf_tempdir(dir, sizeof dir);
    cr_assert(dir[0], "no temporary directory");
    char command[1024], out[16384];
    const char *b = getenv("SYMM_BUILD_DIR") ? getenv("SYMM_BUILD_DIR") : "build";
    snprintf(command, sizeof command, "%s/bin/symmgen -q -o %s/bench specs/bench.lua", b, dir);
    cr_assert_eq(run(command, out, sizeof out), 0, "%s", out);
    const struct {
        const char *args, *want[3], *not_want[2];
    } cases[] = {
        {"--rows g.prefill,b", {"row g.prefill ", "row b ", "2 variants"}, {"row g.decode ", "row b.64 "}},
        {"--rows g.decode", {"row g.decode ", "1 variants", ""}, {"row g.prefill ", "row b "}},
        {"--rows g.prefill,b --groups b", {"row b ", "1 variants", ""}, {"row g.prefill ", "row b.64 "}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        snprintf(command, sizeof command, "%s/bench/moe_bench --manifest %s/bench/manifest.json --plan %s", b, dir,
                 cases[c].args);
        cr_assert_eq(run(command, out, sizeof out), 0, "%s: %s", cases[c].args, out);
        for (int i = 0; i < 3; i++)
            cr_assert(strstr(out, cases[c].want[i]), "%s: no \"%s\" in: %s", cases[c].args, cases[c].want[i], out);
        for (int i = 0; i < 2; i++)
            cr_assert(!strstr(out, cases[c].not_want[i]), "%s: \"%s\" in: %s", cases[c].args, cases[c].not_want[i],
                      out);
    }
    const struct {
        const char *rows, *want;
    } bad[] = {{"g.prefil,b", "--rows: \"g.prefil\" is no row; expected row ids"},
               {"b,g", "--rows: \"g\" is no row"},
               {"b,", "--rows: \"b,\" has an empty entry"},
               {"", "--rows: \"\" has an empty entry"}};
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
        snprintf(command, sizeof command, "%s/bench/moe_bench --manifest %s/bench/manifest.json --plan --rows '%s'", b,
                 dir, bad[c].rows);
        expect_refused(command, bad[c].want, out, sizeof out);
    }
    wf_rmtree(dir);
}

/* scripts/ncu-rank.sh: rank 0 runs the program under ncu, with the
 * options that ncu's --help lists; other ranks run it plainly; without
 * NCU_REPORT rank 0 is refused. A fake ncu prints what it was given. */
Test(ncu_rank, rank_0_runs_under_ncu_the_others_plainly)
{
    char dir[64];
    wf_tempdir(dir, sizeof dir);
    cr_assert(dir[0], "no temporary directory");
    char command[1024], out[8192];
    for (int full = 0; full < 2; full++) {
        snprintf(command, sizeof command,
                 "d=%s; printf '#!/bin/sh\\nif [ \"$1\" = --help ]; then echo \"%s\"; exit 0; fi\\n"
                 "echo ncu \"$*\"\\n' > $d/ncu && chmod +x $d/ncu && "
                 "SYMM_RANK=1 NCU=$d/ncu scripts/ncu-rank.sh echo plain && "
                 "SYMM_RANK=0 NCU=$d/ncu NCU_REPORT=$d/rep NCU_SOURCES=out/bench NCU_KERNEL=symm_dispatch "
                 "scripts/ncu-rank.sh echo profiled",
                 dir, full ? "--sampling-interval --source-folders" : "--metrics");
        cr_assert_eq(run(command, out, sizeof out), 0, "%s", out);
        cr_assert(strstr(out, "plain\n") && !strstr(out, "ncu --target-processes application-only --clock-control "
                                                          "none --cache-control none -k regex:symm_dispatch plain"),
                  "rank 1: %s", out);
        char want[256];
        snprintf(want, sizeof want, "-f -o %s/rep", dir);
        const char *wants[] = {"ncu --target-processes application-only --clock-control none --cache-control none "
                               "-k regex:symm_dispatch --launch-skip 3 --launch-count 1 --metrics "
                               "smsp__pcsamp_warps_issue_stalled_barrier,",
                               ",smsp__pcsamp_warps_issue_stalled_long_scoreboard,",
                               want, " echo profiled"};
        for (size_t i = 0; i < sizeof wants / sizeof wants[0]; i++)
            cr_assert(strstr(out, wants[i]), "full %d: no \"%s\" in: %s", full, wants[i], out);
        cr_assert_eq(strstr(out, "--sampling-interval auto") != NULL, full, "full %d: %s", full, out);
        cr_assert_eq(strstr(out, "--source-folders out/bench") != NULL, full, "full %d: %s", full, out);
    }
    snprintf(command, sizeof command, "SYMM_RANK=0 NCU=%s/ncu scripts/ncu-rank.sh echo x", dir);
    expect_refused(command, "NCU_REPORT (the report's path without .ncu-rep) is not set", out, sizeof out);
    wf_rmtree(dir);
}

/* The bench-check and bench-sanitize steps: check --quick (and under
 * memcheck and racecheck) of specs/bench.lua's BENCH_VARIANTS, a rank per
 * GPU at the host's world: by default the layout-expert variants (both
 * orders; bench-sanitize the decode ones). On fake machines of 2 and 4
 * GPUs whose symmrun prints what it was given. */
Test(device_run, bench_check_and_sanitize_take_the_bench_variants_at_the_host_s_world)
{
    char dir[64];
    wf_tempdir(dir, sizeof dir);
    cr_assert(dir[0], "no temporary directory");
    char command[1024], out[16384];
    const struct {
        int gpus;
        const char *step, *variants, *logs, *manifest, *want, *not_want;
    } cases[] = {
        {2, "bench-check", NULL, "bench-check.log", "--manifest out/bench/manifest.json ",
         "--variant bench_dsv3_prefill_expert_k", "compute-sanitizer"},
        {4, "bench-check", "bench_dsv3_decode,bench_dsv3_prefill", "bench-check.log",
         "--manifest out/bench-w4/manifest.json ", "--variant bench_dsv3_decode --variant bench_dsv3_prefill",
         "bench_dsv3_decode_expert"},
        {2, "bench-sanitize", NULL, "bench-sanitizer-memcheck.log bench-sanitizer-racecheck.log",
         "--manifest out/bench/manifest.json ", "--variant bench_dsv3_decode_expert_fp8", "bench_dsv3_prefill"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char used[32];
        echo_machine(dir, cases[c].gpus, 0, used, sizeof used);
        snprintf(command, sizeof command,
                 "d=%s; env PATH=$d/path:$PATH OUT=$d/out %s%s scripts/device-run.sh $d/build %s && "
                 "cd $d/out && tar xzf logs.tgz && cat %s",
                 dir, cases[c].variants ? "BENCH_VARIANTS=" : "", cases[c].variants ? cases[c].variants : "",
                 cases[c].step, cases[c].logs);
        cr_assert_eq(run(command, out, sizeof out), 0, "%s", out);
        char ranks[64];
        symmrun_ranks(ranks, sizeof ranks, cases[c].gpus);
        const char *wants[] = {ranks, cases[c].manifest, "--quick --graph-replays 2", cases[c].want};
        for (size_t i = 0; i < sizeof wants / sizeof wants[0]; i++)
            cr_assert(strstr(out, wants[i]), "%s, %d GPUs: no \"%s\" in: %s", cases[c].step, cases[c].gpus, wants[i], out);
        cr_assert(!strstr(out, cases[c].not_want), "%s, %d GPUs: \"%s\" in: %s", cases[c].step, cases[c].gpus,
                  cases[c].not_want, out);
        if (!strcmp(cases[c].step, "bench-sanitize"))
            cr_assert(strstr(out, "--tool memcheck") && strstr(out, "--tool racecheck"), "both tools: %s", out);
    }
    wf_rmtree(dir);
}

Test(link_probe, its_kernels_compile_for_sm_90a_without_a_warning)
{
    symm_jit_request req = {.source = probe_source, .source_name = "link_probe.cu", .arch = "sm_90a",
                            .flags = SYMM_JIT_NO_CACHE};
    symm_jit_result res;
    const symm_status st = symm_jit_compile(&req, &res);
    cr_assert_eq(st, SYMM_OK, "link_probe's kernels: %s: %s", symm_status_name(st), symm_last_error());
    cr_assert(res.cubin_size > 0, "link_probe's kernels: no cubin");
    cr_assert(!res.log || !res.log[0], "link_probe's kernels: NVRTC warns: %s", res.log);
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++)
        cr_assert(memmem(res.cubin, res.cubin_size, kernels[i], strlen(kernels[i]) + 1),
                  "link_probe's kernels: no %s in the cubin", kernels[i]);
    symm_jit_result_free(&res);
}

/* scripts/bench.sh's stall watchdog (BENCH_STALL_S): on a fake machine of 2
 * GPUs whose symmrun starts two fake moe_bench ranks that print a line, stop
 * printing for 5 s and print again, and a fake gdb on PATH, a watchdog of
 * 2 s writes each rank's stacks (gdb -p PID -batch -ex "thread apply all
 * bt") and nvidia-smi's output to stalls.txt once for that stall, and
 * copies it to $OUT; the ranks' output is in bench.log as without it, and
 * with BENCH_STALL_S=0 (or no stall) there is no stalls.txt. */
Test(bench, the_stall_watchdog_writes_every_rank_s_stacks_once_per_stall)
{
    char dir[64];
    wf_tempdir(dir, sizeof dir);
    cr_assert(dir[0], "no temporary directory");
    char command[2048], out[16384];
    fake_machine(dir, 2, "while [ \"$1\" != -- ]; do shift; done; shift; SYMM_RANK=0 \"$@\" & SYMM_RANK=1 \"$@\" & wait");
    snprintf(command, sizeof command,
             "d=%s; mkdir -p $d/build/bench $d/gdbpath && "
             "printf '#!/bin/sh\\necho rank $SYMM_RANK row one\\nsleep 5\\necho rank $SYMM_RANK row two\\n' > "
             "$d/build/bench/moe_bench && "
             "printf '#!/bin/sh\\nexit 0\\n' > $d/build/bench/jit_bench && "
             "printf '#!/bin/sh\\nexit 0\\n' > $d/build/bench/link_probe && "
             "printf '#!/bin/sh\\necho \"fake gdb $*\"\\n' > $d/gdbpath/gdb && "
             "chmod +x $d/build/bench/* $d/gdbpath/gdb",
             dir);
    cr_assert_eq(run(command, out, sizeof out), 0, "%s", out);
    const struct {
        const char *stall_s;
        int dumps;
    } cases[] = {{"2", 1}, {"0", 0}, {"30", 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        snprintf(command, sizeof command,
                 "d=%s; rm -rf $d/out/* && env PATH=$d/gdbpath:$d/path:$PATH OUT=$d/out BENCH_OUT=$d/out/bench "
                 "BENCH_RESULTS=none BENCH_COMMIT=test BENCH_STALL_S=%s SYMM_BUILD_DIR=$d/build scripts/bench.sh "
                 "> $d/run.log 2>&1; echo \"rc=$?\"; grep -c 'row one' $d/out/bench/bench.log; "
                 "grep -c 'row two' $d/out/bench/bench.log; "
                 "if [ -f $d/out/stalls.txt ]; then cat $d/out/stalls.txt; else echo no-stalls; fi",
                 dir, cases[c].stall_s);
        cr_assert_eq(run(command, out, sizeof out), 0, "%s", out);
        cr_assert(!strncmp(out, "rc=0\n2\n2\n", 9), "BENCH_STALL_S=%s: bench.sh or the ranks' output: %s",
                  cases[c].stall_s, out);
        int dumps = 0, stacks = 0;
        for (const char *p = out; (p = strstr(p, "bench.log has not grown")); p++)
            dumps++;
        for (const char *p = out; (p = strstr(p, "fake gdb -p ")); p++) {
            stacks++;
            cr_assert(!strncmp(strchr(p + 12, ' '), " -batch -ex thread apply all bt", 31), "%s", out);
        }
        cr_assert_eq(dumps, cases[c].dumps, "BENCH_STALL_S=%s: %d dumps: %s", cases[c].stall_s, dumps, out);
        cr_assert_eq(stacks, 2 * cases[c].dumps, "BENCH_STALL_S=%s: %d stacks: %s", cases[c].stall_s, stacks, out);
        if (cases[c].dumps) {
            cr_assert(strstr(out, "rank 0: host thread stacks") && strstr(out, "rank 1: host thread stacks"), "%s",
                      out);
            cr_assert(strstr(out, "--- nvidia-smi\nGPU 0: fake"), "%s", out);
        } else {
            cr_assert(strstr(out, "no-stalls"), "%s", out);
        }
    }
    wf_rmtree(dir);
}
