# Loss curves from spbench --loss-log CSV files.
# gnuplot -e "out='loss.png'; files='a.csv b.csv'; titles='a b'; machine='...'" plots/loss.gp
if (!exists("out")) out = 'loss.png'
if (!exists("machine")) machine = ''
if (!exists("subtitle")) subtitle = ''
set datafile separator ','
set terminal pngcairo size 900,560 noenhanced font ',11'
set output out
set title sprintf("spbench: training loss (byte-level, nats/token)\n%s\n%s", subtitle, machine)
set xlabel 'iteration'
set ylabel 'lm loss (nats per token)'
set key top right
set grid
plot for [i=1:words(files)] word(files, i) using 1:2 skip 1 with lines lw (i == 1 ? 5 : 1.5) dt i lc i title word(titles, i)
