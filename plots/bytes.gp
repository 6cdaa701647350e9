# Bytes per link per layer and micro-step (forward + backward collectives of
# the layers) against N/P: measured (points) and the strategies' formulas
# (dashed, open circles).  One block per series: x, measured, predicted; x is N/P,
# or P when N/P is the same at every point (weak scaling), or N on a linear
# axis (logx = 0, ticks in xtics_at) when N/P differs by a fraction (uneven splits); lines = 0
# (several points of a series at one x): the formula's circles without a line.  Variables from plots/render.
set datafile separator whitespace
if (term eq 'svg') { set terminal svg size 1300,650 dynamic noenhanced font 'DejaVu Sans,12' } \
else { set terminal pngcairo size 1300,650 noenhanced font 'DejaVu Sans,11' }
set output out
set title title font ',12'
if (!exists("xlabel")) xlabel = 'tokens per rank N/P'
set xlabel xlabel
set ylabel 'MiB per link per layer per micro-step (forward + backward)'
if (!exists("logx")) logx = 1
if (!exists("lines")) lines = 1
if (logx) { set logscale x 2 } else { unset logscale x }
if (exists("xtics_at")) { eval xtics_at }
set logscale y 2
set grid
set offsets graph 0.05, graph 0.05, graph 0.05, graph 0.05
set key top left Left reverse box opaque font ',10'
style = lines ? 'linespoints dt 2 lw 2' : 'points'
plot for [i=0:n-1] data index i using 1:2 with points pt 7 ps 1.6 lc i+1 title columnheader(1), \
     for [i=0:n-1] data index i using 1:3 with @style pt 6 ps 3 lc i+1 notitle, \
     NaN with @style pt 6 ps 3 lc rgb 'black' title 'predicted (comm_volume formula)'
