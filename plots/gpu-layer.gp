# The 7B layer's TFLOP/s per GPU against N (one panel).  Series numbered
# 1..ns: title T[i], colour C[i], dash type DT[i], point type PT[i]; data_main
# holds one block per series ("tokens tflops" lines), n_main of them, block j
# drawing series S_main[j].  Long-dashed black: the data-sheet peak `peak`
# and the measured GEMM ceiling `ceil` (NaN: none), labelled peak_label and
# ceil_label.
# Key below the plot.  Variables from plots/gpu-figures, in a file loaded first.
set datafile separator whitespace
set terminal pngcairo size 1200,780 noenhanced font 'DejaVu Sans,11'
set output out
set title title font ',12'
set grid
set logscale x 2
eval xtics_at
set xlabel 'sequence length N (tokens)'
set ylabel "TFLOP/s per GPU (paper's formula)"
set yrange [0:ymax]
set ytics 100
set bmargin 9
set key at screen 0.5, 0.015 center bottom vertical maxrows 4 Left reverse box opaque samplen 3 spacing 1.2 width 2 font ',10'
if (peak == peak) { set label 1 peak_label at graph 0.02, first peak + ymax * 0.03 left font ',10' }
if (ceil == ceil) { set label 2 ceil_label at graph 0.02, first ceil + ymax * 0.03 left font ',10' }
plot for [j=1:n_main] data_main index j-1 using 1:2 with linespoints lw 2 ps 1.3 pt PT[S_main[j]] dt DT[S_main[j]] lc rgb C[S_main[j]] notitle, \
     for [i=1:ns] NaN with linespoints lw 2 ps 1.3 pt PT[i] dt DT[i] lc rgb C[i] title T[i], \
     peak with lines lw 1.5 dt (14,8) lc rgb 'black' notitle, \
     ceil with lines lw 1.5 dt (14,8) lc rgb 'black' notitle
