# Sensitivity (MODELLED): predicted TFLOPs/GPU of Ulysses, Megatron-SP and ring
# for 7B at N = 32K ... 1M as P grows, one node (P = 8) and across nodes.
# gnuplot -e "data='results/model/plotdata'; out='results/model'" plots/model-sensitivity.gp
if (!exists("data")) data = 'results/model/plotdata'
if (!exists("out")) out = 'results/model'
set terminal pngcairo size 1500,560 noenhanced font ',11'
set output out.'/model-sensitivity-7b.png'
set datafile missing NaN
set grid
set logscale x 2
set yrange [0:*]
set key bottom right
set xlabel 'sequence length (K tokens)'
set multiplot layout 1,3 title "Sensitivity (MODELLED): 7B GPT (32 heads), D = 1, ZeRO-3, A100-80GB DGX profile; missing points = invalid (P > heads) or does not fit"
do for [P in "8 32 128"] {
  where = (P eq '8') ? 'one node (NVSwitch)' : sprintf('%d nodes (InfiniBand)', int(P)/8)
  set title sprintf('P = %s GPUs, %s', P, where)
  set ylabel 'TFLOPs per GPU (paper formula)'
  plot data.'/sensitivity-P'.P.'.dat' u 1:2 w lp lw 2 pt 7 t 'Ulysses', \
       data.'/sensitivity-P'.P.'.dat' u 1:3 w lp lw 2 pt 5 t 'Megatron-SP', \
       data.'/sensitivity-P'.P.'.dat' u 1:4 w lp lw 2 pt 9 t 'ring (zigzag)'
}
unset multiplot
