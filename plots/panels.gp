# A grid of panels (rows x cols) under one title: the frame only.  Each
# panel's settings and plot command are in `panels` (written by plots/render:
# the gqa sweep's figures against G and against P, one row per model shape,
# a column for bytes and one for step time per N).  Variables from
# plots/render: term, out, width, height, rows, cols, title, panels.
set datafile separator whitespace
if (term eq 'svg') { set terminal svg size width,height dynamic noenhanced font 'DejaVu Sans,12' } \
else { set terminal pngcairo size width,height noenhanced font 'DejaVu Sans,11' }
set output out
# the title's three lines take about 75 pixels, each row's two-line panel titles about 40
set multiplot layout rows,cols title title font ',12' margins 0.06,0.99,55.0/height,1-115.0/height spacing 0.075,110.0/height
set grid
load panels
unset multiplot
