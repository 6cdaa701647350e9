# Two panels against one x: panel 1 columns 2:3:4 (value, low, high: error
# bars), panel 2 column 5 (and 6, dashed, when y2b_title is set).  One data
# block per series (first line of a block: its title).  Points that did not
# run (out of memory, invalid, ...) come from `fails`, one block per status,
# drawn as crosses at the foot of both panels.  Lines 9 and on, where the 8
# colours repeat, are dashed with square points.  Variables are set by
# plots/render in a file loaded before this one; optional: height (pixels)
# and keyspec (the key's placement, e.g. below for many lines).
set datafile separator whitespace
if (!exists("height")) height = 560
if (term eq 'svg') { set terminal svg size 1300,height dynamic noenhanced font 'DejaVu Sans,12' } \
else { set terminal pngcairo size 1300,height noenhanced font 'DejaVu Sans,11' }
set output out
set multiplot layout 1,2 title title font ',12'
set grid
if (!exists("keyspec")) keyspec = "top left Left reverse box opaque samplen 2 spacing 1.1 font ',10'"
eval("set key " . keyspec)
set xlabel xlabel
if (logx) { set logscale x 2 } else { unset logscale x }
if (exists("xtics_at")) { eval xtics_at }
set ylabel y1label
if (!exists("y1base")) y1base = 10
if (logy1) { set logscale y y1base; set format y '%.0f' } else { unset logscale y }
set yrange [y1min:y1max]
set title panel1
plot for [i=0:n-1] data index i using 1:2:3:4 with yerrorlines lw 2 pt 7-2*(i>=8) ps 1.2 lc i+1 dt 1+(i>=8) title columnheader(1), \
     for [j=0:nfail-1] fails index j using 1:2 with points pt (j % 3 == 0 ? 2 : (j % 3 == 1 ? 3 : 1)) ps 2.2 lw 3 lc rgb (j % 2 ? '#8c564b' : '#d62728') title columnheader(1)
set ylabel y2label
if (logy2) { set logscale y; set format y '%.0f' } else { unset logscale y; set format y '%g' }
set yrange [y2min:y2max]
set title panel2
if (y2b_title ne '') {
    plot for [i=0:n-1] data index i using 1:5 with linespoints lw 2 pt 7-2*(i>=8) ps 1.2 lc i+1 dt 1+(i>=8) title columnheader(1), \
         for [i=0:n-1] data index i using 1:6 with linespoints lw 1.5 dt 2 pt 6 ps 1 lc i+1 notitle, \
         NaN with lines dt 2 lc rgb 'black' title y2b_title, \
         for [j=0:nfail-1] fails index j using 1:3 with points pt (j % 3 == 0 ? 2 : (j % 3 == 1 ? 3 : 1)) ps 2.2 lw 3 lc rgb (j % 2 ? '#8c564b' : '#d62728') notitle
} else {
    plot for [i=0:n-1] data index i using 1:5 with linespoints lw 2 pt 7-2*(i>=8) ps 1.2 lc i+1 dt 1+(i>=8) title columnheader(1), \
         for [j=0:nfail-1] fails index j using 1:3 with points pt (j % 3 == 0 ? 2 : (j % 3 == 1 ? 3 : 1)) ps 2.2 lw 3 lc rgb (j % 2 ? '#8c564b' : '#d62728') notitle
}
unset multiplot
