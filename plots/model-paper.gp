# Paper-scale projections (MODELLED) from scripts/project-paper's plot data.
# gnuplot -e "data='results/model/plotdata'; out='results/model'" plots/model-paper.gp
if (!exists("data")) data = 'results/model/plotdata'
if (!exists("out")) out = 'results/model'
set terminal pngcairo size 1000,620 noenhanced font ',11'
set grid
set key top left
set datafile missing NaN

set output out.'/paper-fig3.png'
set title "fig3 (MODELLED): 1.2B GPT, Ulysses + ZeRO-3, longest sequence that fits\nA100 DGX profiles; P = min(GPUs, 16 heads), D = GPUs / P"
set logscale x 2
set logscale y 2
set xlabel 'GPUs'
set ylabel 'longest sequence that fits (tokens)'
set y2label 'TFLOPs/GPU at that length (paper formula)'
set y2tics
set y2range [0:350]
set ytics nomirror
set key bottom right
set format y '%.0s%c'
plot data.'/fig3.dat' u 1:2 w lp lw 2 pt 7 t 'max N, A100-80GB', \
     data.'/fig3.dat' u 1:4 w lp lw 2 pt 5 t 'max N, A100-40GB', \
     data.'/fig3.dat' u 1:3 axes x1y2 w lp dt 2 lw 2 pt 6 t 'TFLOPs/GPU, 80GB (right)', \
     data.'/fig3.dat' u 1:5 axes x1y2 w lp dt 2 lw 2 pt 4 t 'TFLOPs/GPU, 40GB (right)'
unset y2label
unset y2tics
unset y2range
set key top left
set ytics mirror
unset logscale y
set format y '%g'

do for [e in "fig4 fig5 fig6 fig7"] {
  set output out.'/paper-'.e.'.png'
  model = (e eq 'fig4' || e eq 'fig6') ? '7B on 32 GPUs' : '30B on 64 GPUs'
  kind = (e eq 'fig6' || e eq 'fig7') ? 'blocked sparse attention (ASSUMED 4K-key window)' : 'dense causal attention'
  set title sprintf("%s (MODELLED): %s, %s\npaper-stack profile (A100 DGX, FlashAttention v1 era); shaded: calibration band; missing = does not fit", e, model, kind)
  set xlabel 'sequence length (K tokens)'
  set ylabel ((e eq 'fig6' || e eq 'fig7') ? 'counted TFLOPs per GPU (computed blocks only)' : 'TFLOPs per GPU (paper formula)')
  set yrange [0:*]
  # shaded: the band of the profile's calibration spread (columns 5-10: each system's low, high)
  set key bottom right opaque
  if (e eq 'fig4' || e eq 'fig5') {
    plot data.'/'.e.'.dat' u 1:5:6 w filledcurves fs transparent solid 0.15 lc 1 notitle, \
         data.'/'.e.'.dat' u 1:7:8 w filledcurves fs transparent solid 0.15 lc 2 notitle, \
         data.'/'.e.'.dat' u 1:9:10 w filledcurves fs transparent solid 0.15 lc 3 notitle, \
         data.'/'.e.'.dat' u 1:2 w lp lw 2 pt 7 lc 1 t 'Ulysses + ZeRO-3', \
         data.'/'.e.'.dat' u 1:3 w lp lw 2 pt 5 lc 2 t 'Megatron-SP', \
         data.'/'.e.'.dat' u 1:4 w lp lw 2 pt 9 lc 3 t 'ring (ColAI-SP modern: zigzag, ZeRO-1/3)'
  } else {
    plot data.'/'.e.'.dat' u 1:5:6 w filledcurves fs transparent solid 0.15 lc 1 notitle, \
         data.'/'.e.'.dat' u 1:7:8 w filledcurves fs transparent solid 0.15 lc 2 notitle, \
         data.'/'.e.'.dat' u 1:2 w lp lw 2 pt 7 lc 1 t 'Ulysses + ZeRO-3', \
         data.'/'.e.'.dat' u 1:3 w lp lw 2 pt 5 lc 2 t 'Megatron-SP'
  }
}

set output out.'/model-sp-degree.png'
set key bottom left
set title "SP degree (MODELLED): 7B (32 heads), 256 GPUs, N = 256K, ZeRO-3, A100-80GB DGX\nUlysses and Megatron-SP need P | heads: nothing past P = 32; missing = invalid or does not fit"
set xlabel 'sequence-parallel degree P (D = 256 / P)'
set ylabel 'TFLOPs per GPU (paper formula)'
set logscale x 2
plot data.'/sp-degree.dat' u 1:2 w lp lw 2 pt 7 t 'Ulysses', \
     data.'/sp-degree.dat' u 1:3 w lp lw 2 pt 5 t 'Megatron-SP', \
     data.'/sp-degree.dat' u 1:4 w lp lw 2 pt 9 t 'ring (zigzag)'

set output out.'/model-weak-scaling.png'
set key bottom right
set title "Weak scaling (MODELLED): 7B, N = 4K tokens per GPU, ZeRO-3, A100-80GB DGX\nUlysses P = min(GPUs, 32 heads); ring P = GPUs"
set xlabel 'GPUs'
plot data.'/weak-scaling.dat' u 1:3 w lp lw 2 pt 7 t 'Ulysses', \
     data.'/weak-scaling.dat' u 1:4 w lp lw 2 pt 9 t 'ring (zigzag)'
