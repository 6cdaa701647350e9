# Stacked bars: one bar per row of `data` (first column: its label), one
# stack segment per further column (header line: segment names).  Used for
# the step time by kind and the memory by category.  Variables from plots/render.
set datafile separator '\t'
if (term eq 'svg') { set terminal svg size width,700 dynamic noenhanced font 'DejaVu Sans,12' } \
else { set terminal pngcairo size width,700 noenhanced font 'DejaVu Sans,11' }
set output out
set title title font ',12'
set ylabel ylabel
set style data histograms
set style histogram rowstacked
set style fill solid 0.85 border -1
set boxwidth 0.7
set key below horizontal maxrows 2 font ',10'
set grid ytics
set yrange [0:*]
set xtics rotate by -35 left font ',10' nomirror
set bmargin 10
plot for [i=2:ncol] data using i:xtic(1) title columnheader(i)
