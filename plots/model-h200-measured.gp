# 7B on 32 H200s (MODELLED): TFLOPs/GPU of Ulysses, Megatron-SP and ring at
# 32K-256K tokens, priced three ways: the assumed H200 profile, and the
# compute measured on one H200 with spbench's flash kernels or cuDNN's
# attention (scripts/project-gpu-measured writes the data).
# gnuplot -e "data='results/model/plotdata'; out='results/model'" plots/model-h200-measured.gp
if (!exists("data")) data = 'results/model/plotdata'
if (!exists("out")) out = 'results/model'
set terminal pngcairo size 1500,560 noenhanced font ',11'
set output out.'/model-h200-measured.png'
set datafile missing NaN
set grid
set logscale x 2
set yrange [0:1100]
# the paper's formula counts all N^2 pairs, causal attention computes half: it can near the peak
set arrow 1 from graph 0, first 989.4 to graph 1, first 989.4 nohead dt 2 lc rgb 'gray40'
set label 1 'H200 dense bf16 peak 989 (data sheet)' at graph 0.02, first 1030 tc rgb 'gray40'
set key bottom right
set xlabel 'sequence length (K tokens)'
set multiplot layout 1,3 title "7B on 32 H200s (MODELLED; compute rates measured on one H200 or assumed): P = 8, D = 4, ZeRO-3, checkpointing"
do for [s in "ulysses megatron ring"] {
  name = (s eq 'ulysses') ? 'Ulysses' : ((s eq 'megatron') ? 'Megatron-SP' : 'ring (zigzag)')
  set title name
  set ylabel 'TFLOPs per GPU (paper formula)'
  plot data.'/h200-measured-'.s.'.dat' u 1:2 w lp lw 2 pt 7 t 'assumed profile (FA3-class attention)', \
       data.'/h200-measured-'.s.'.dat' u 1:4 w lp lw 2 pt 9 t 'measured: cuDNN attention', \
       data.'/h200-measured-'.s.'.dat' u 1:3 w lp lw 2 pt 5 t 'measured: spbench flash kernels'
}
unset multiplot
