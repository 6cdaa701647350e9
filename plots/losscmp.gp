# Loss curves of several runs (one data block each: iteration, loss, loss
# minus the reference run's) and their difference from the reference.
set datafile separator whitespace
if (term eq 'svg') { set terminal svg size 1300,560 dynamic noenhanced font 'DejaVu Sans,12' } \
else { set terminal pngcairo size 1300,560 noenhanced font 'DejaVu Sans,11' }
set output out
set multiplot layout 1,2 title title font ',12'
set grid
set xlabel 'iteration'
set ylabel 'lm loss (nats per byte-token)'
set key top right Left reverse box opaque font ',10'
set title 'training loss'
plot for [i=0:n-1] data index i using 1:2 with lines lw (i == 0 ? 5 : 1.8) lc i+1 title columnheader(1)
set ylabel sprintf('loss minus %s (nats)', reflabel)
set title sprintf('difference from %s', reflabel)
# two columns of entries (three rows at least), the plot pushed down below them
rows = (n > 6) ? n / 2 : 3
set key top left Left reverse box opaque font ',10' maxrows rows
set offsets 0, 0, graph (0.1 + 0.08 * rows), graph 0.05
plot for [i=1:n-1] data index i using 1:3 with lines lw 1.8 lc i+1 title columnheader(1)
unset multiplot
