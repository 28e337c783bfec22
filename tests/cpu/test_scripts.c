/* test_scripts.c: the parts of the GPU scripts that run without a GPU.
 * scripts/bench-tune.sh --rounds: the runs' order (the list in odd rounds,
 * reversed in even ones), and its refusal of a bad count. Run from the
 * repository root, as make test does. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

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
        const int rc = run(command, out, sizeof out);
        cr_assert_eq(rc, 2, "--rounds %s: exit status %d: %s", bad[i], rc, out);
        cr_assert(strstr(out, "expected an integer 1..20"), "--rounds %s: %s", bad[i], out);
    }
    char out[1024];
    cr_assert_eq(run("scripts/bench-tune.sh --dry-run --rounds", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "--rounds needs a value"), "%s", out);
}
