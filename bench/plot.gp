# plot.gp: the PNG plots of a moe_bench CSV (scripts/bench.sh runs it where
# gnuplot exists; elsewhere, afterwards, on any machine with gnuplot 5.4+):
#
#   gnuplot -e "csv='bench/out/moe_bench.csv'" bench/plot.gp
#
# writes, beside the CSV (or into outdir='DIR' when given):
#   gbs_vs_tokens.png  remote GB/s per GPU against tokens per rank, rows of
#                      group e (the T sweep of the DeepSeek-V3 prefill shape):
#                      ours (dispatch, combine), NCCL backend, raw NCCL, ceiling
#   gbs_vs_sms.png     the same against the SM budget, rows of group f, and
#                      the pulling combine of group p (rows p.f.8, p.f.16, p.a)
# Columns are found by their names in the CSV header (bench/moe_bench.c);
# `smooth unique` orders each curve by x, whatever the order of the rows.

if (!exists("csv")) {
    print "plot.gp: usage: gnuplot -e \"csv='bench/out/moe_bench.csv'\" bench/plot.gp"
    exit gnuplot
}
if (!exists("outdir")) {
    outdir = "."
    # the directory of csv: everything up to its last slash
    do for [i = strlen(csv):1:-1] {
        if (outdir eq "." && csv[i:i] eq "/") { outdir = csv[1:i-1] }
    }
}

set datafile separator ","
set datafile columnheaders
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 1100,700 font ",11"
} else {
    set terminal png size 1100,700
}
set grid
set key outside right top
set ylabel "remote GB/s per GPU (payload bytes / p50 time)"
set yrange [0:*]

# A column of rows of one group, else NaN (the row is skipped).
in(g, name) = strcol("group") eq g ? column(name) : NaN
# Rows of group p (combine = "pull") at (a)'s shape, T = 4096, layout rank:
# the pulling combine against the SM budget.
in_pull(name) = strcol("group") eq "p" && column("tokens") == 4096 && strcol("layout") eq "rank" ? column(name) : NaN
# Rows of a group in the CSV (a run with --groups may lack some).
rows(g) = int(system(sprintf("grep -c '^%s\\.' '%s' || true", g, csv)))
done = ""

if (rows("e") > 0) {
    set output outdir."/gbs_vs_tokens.png"
    set title "dispatch / combine bandwidth against tokens per rank (group e)"
    set xlabel "tokens per rank (T)"
    set logscale x 2
    plot csv using (in("e", "tokens")):"dispatch_gbs" smooth unique with linespoints lw 2 title "ours: dispatch", \
         csv using (in("e", "tokens")):"combine_gbs" smooth unique with linespoints lw 2 title "ours: combine", \
         csv using (in("e", "tokens")):"nccl_dispatch_gbs" smooth unique with linespoints dt 2 title "NCCL backend: dispatch", \
         csv using (in("e", "tokens")):"nccl_combine_gbs" smooth unique with linespoints dt 2 title "NCCL backend: combine", \
         csv using (in("e", "tokens")):"raw_nccl_gbs" smooth unique with linespoints dt 3 lw 2 title "raw NCCL send/recv", \
         csv using (in("e", "tokens")):"ceiling_gbs" smooth unique with linespoints dt 4 lw 2 title "copy-engine ceiling"
    done = done." ".outdir."/gbs_vs_tokens.png"
}

if (rows("f") > 0) {
    set output outdir."/gbs_vs_sms.png"
    set title "dispatch / combine bandwidth against the SM budget (groups f and p, T = 4096)"
    set xlabel "SMs (blocks per kernel, the variant's sms)"
    unset logscale x
    plot csv using (in("f", "sms")):"dispatch_gbs" smooth unique with linespoints lw 2 title "ours: dispatch", \
         csv using (in("f", "sms")):"combine_gbs" smooth unique with linespoints lw 2 title "ours: combine", \
         csv using (in_pull("sms")):"combine_gbs" smooth unique with linespoints lw 2 title "ours: combine, pull (group p)", \
         csv using (in("f", "sms")):"raw_nccl_gbs" smooth unique with linespoints dt 3 lw 2 title "raw NCCL send/recv", \
         csv using (in("f", "sms")):"ceiling_gbs" smooth unique with linespoints dt 4 lw 2 title "copy-engine ceiling"
    done = done." ".outdir."/gbs_vs_sms.png"
}

unset output
print "plot.gp: wrote".(done eq "" ? " nothing (no rows of groups e and f in ".csv.")" : done)
