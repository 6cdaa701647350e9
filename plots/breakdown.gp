# Step time of each run, stacked by kind (slowest rank's breakdown), from
# spbench --results CSV rows.
# gnuplot -e "csv='results.csv'; out='breakdown.png'; subtitle='line 1\nline 2'" plots/breakdown.gp
if (!exists("out")) out = 'breakdown.png'
if (!exists("subtitle")) subtitle = ''
set datafile separator ','
set datafile columnheaders
set terminal pngcairo size 1100,680 noenhanced font ',11'
set output out
set title sprintf("spbench: time per iteration by kind (slowest rank)\n%s", subtitle) noenhanced
set ylabel 'seconds per iteration'
set style data histograms
set style histogram rowstacked
set style fill solid 0.85 border -1
set boxwidth 0.6
set key below horizontal
set grid ytics
set xtics rotate by -25 offset -1,0
set bmargin 9
set rmargin 6
plot csv using (column("time_gemm_s")):xtic(1) title 'matrix products', \
     '' using (column("time_attention_s")) title 'attention', \
     '' using (column("other_compute_s")) title 'other compute', \
     '' using (column("layer_comm_s")) title 'communication in layers (incl. waiting)', \
     '' using (column("time_grad_reduce_s")) title 'gradient reduction', \
     '' using (column("time_optimizer_s")) title 'optimizer'
