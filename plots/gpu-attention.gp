# Attention TFLOP/s against the sequence length, two panels: forward |
# backward.  Series are numbered 1..ns: title T[i], colour C[i], dash type
# DT[i], point type PT[i]; data_fwd / data_bwd hold one block per series
# that has rows there ("tokens tflops" lines), n_fwd / n_bwd of them, block j
# drawing series S_fwd[j] / S_bwd[j].  One key for both panels, below them.
# Long-dashed black: the measured GEMM ceiling `ceil` (NaN: none), labelled
# ceil_label.  Variables from plots/gpu-figures, in a file loaded first.
set datafile separator whitespace
set terminal pngcairo size 1300,640 noenhanced font 'DejaVu Sans,11'
set output out
set multiplot layout 1,2 title title font ',12'
set grid
set logscale x 2
eval xtics_at
set xlabel 'sequence length N (tokens)'
set ylabel 'TFLOP/s (4*D fwd, 10*D bwd per visible query-key pair)'
set yrange [0:ymax]
set ytics 100
set bmargin 7
set key at screen 0.5, 0.015 center bottom vertical maxrows 2 Left reverse box opaque samplen 3 spacing 1.2 width 2 font ',10'
if (ceil == ceil) { set label 1 ceil_label at graph 0.02, first ceil + ymax * 0.03 left font ',10' }
set title 'forward'
if (n_fwd == 0) { set label 3 'no forward rows' at graph 0.5, 0.5 center } else { unset label 3 }
plot for [j=1:n_fwd] data_fwd index j-1 using 1:2 with linespoints lw 2 ps 1.3 pt PT[S_fwd[j]] dt DT[S_fwd[j]] lc rgb C[S_fwd[j]] notitle, \
     for [i=1:ns] NaN with linespoints lw 2 ps 1.3 pt PT[i] dt DT[i] lc rgb C[i] title T[i], \
     ceil with lines lw 1.5 dt (14,8) lc rgb 'black' title (ceil == ceil ? 'measured bf16 GEMM ceiling' : '')
unset key
set title 'backward'
if (n_bwd == 0) { set label 3 'no backward rows' at graph 0.5, 0.5 center } else { unset label 3 }
plot for [j=1:n_bwd] data_bwd index j-1 using 1:2 with linespoints lw 2 ps 1.3 pt PT[S_bwd[j]] dt DT[S_bwd[j]] lc rgb C[S_bwd[j]] notitle, \
     ceil with lines lw 1.5 dt (14,8) lc rgb 'black' notitle
unset multiplot
