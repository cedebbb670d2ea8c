#!/usr/bin/env bash
# Plots of `pagedattn bench attention --csv` results (gnuplot, PNG), CPU or CUDA:
#   scripts/plot-kernels.sh CSV [OUTDIR]
# Decode GB/s of K/V read (left axis) and % of the roofline measured in the same run (right axis):
#   OUTDIR/kernels_<device>_page.png      vs page size, a panel per batch, a line per context
#   OUTDIR/kernels_<device>_context.png   vs context, a panel per batch, a line per page size
#   OUTDIR/kernels_<device>_gqa_dtype.png vs page size, a panel per batch and context, a line per
#                                         GQA ratio and KV dtype
# The first two show one GQA ratio and KV dtype: the GQA ratio of most decode rows and bf16 where
# present (GQA=, KV_DTYPE= in the environment choose others).
#   OUTDIR/kernels_<device>_prefill.png   prefill TFLOP/s and dense/paged time vs page size
# OUTDIR defaults to the folder of CSV. Installs gnuplot-nox when gnuplot is missing.
set -euo pipefail

if [[ $# -lt 1 || ! -f $1 ]]; then
  echo "usage: $0 CSV [OUTDIR]" >&2
  exit 2
fi
csv=$1
outdir=${2:-$(dirname "$csv")}
mkdir -p "$outdir"

bash "$(dirname "$0")/ensure-gnuplot.sh"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Columns by header name, so the script survives new columns.
col() {
  local c
  c=$(head -1 "$csv" | tr -d '\r' | tr ',' '\n' | grep -nx "$1" | cut -d: -f1)
  [[ -n $c ]] || { echo "$0: $csv has no column '$1'" >&2; exit 2; }
  echo "$c"
}
# Every row as: mode batch context page gqa dtype gbps pct dense_over_paged tflops head_dim
awk -F, -v m="$(col mode)" -v b="$(col batch)" -v c="$(col context)" -v p="$(col page_size)" \
  -v g="$(col gqa)" -v t="$(col kv_dtype)" -v gb="$(col gbps)" -v pc="$(col pct_roofline)" \
  -v r="$(col dense_over_paged)" -v tf="$(col tflops)" -v d="$(col head_dim)" \
  'NR > 1 { print $m, $b, $c, $p, $g, $t, $gb, $pc, ($r == "" ? "NaN" : $r), $tf, $d }' \
  "$csv" > "$work/rows"
device=$(awk -F, -v c="$(col device)" 'NR == 2 { print $c }' "$csv")
hardware=$(awk -F, -v c="$(col hardware)" 'NR == 2 { print $c }' "$csv")
roofline=$(awk -F, -v c="$(col roofline_gbps)" 'NR == 2 { printf "%.1f", $c }' "$csv")
[[ -n $device ]] || { echo "$0: $csv has no rows" >&2; exit 2; }
awk '$1 == "decode"' "$work/rows" > "$work/decode"
awk '$1 == "prefill"' "$work/rows" > "$work/prefill"

# The slice of the first two plots: a head dim, GQA ratio and dtype.
gqa=${GQA:-$(awk '{ n[$5]++ } END { for (g in n)
  if (n[g] > best || (n[g] == best && g + 0 < bg + 0)) { best = n[g]; bg = g }; print bg }' \
  "$work/decode")}
kv_dtype=${KV_DTYPE:-}
if [[ -z $kv_dtype ]]; then
  kv_dtype=$(awk '$6 == "bf16" { f = 1 } END { print f ? "bf16" : "" }' "$work/decode")
  [[ -n $kv_dtype ]] || kv_dtype=$(awk 'NR == 1 { print $6 }' "$work/decode")
fi
head_dim=$(awk -v g="$gqa" -v t="$kv_dtype" '$5 == g && $6 == t { print $11; exit }' "$work/decode")

# Distinct values of field $1 of file $2 (numeric order), one a line.
values() { awk -v f="$1" '!seen[$f]++ { print $f }' "$2" | sort -g; }
# gnuplot x axis (log 2) with a tic at each value of field $1 of file $2.
xaxis() {
  echo "set xtics ($(values "$1" "$2" | paste -sd, -))"
  values "$1" "$2" | awk 'NR == 1 { lo = $1 } { hi = $1 }
    END { printf "set xrange [%g:%g]\n", lo / 1.25, hi * 1.25 }'
}
# Right axis tics for % of roofline: a round step, about 5 of them up to the largest % in file $1.
pct_tics() {
  awk '$8 > m { m = $8 } END { raw = (m > 0 ? m : 1) / 5; p = 10 ^ int(log(raw) / log(10))
    if (p > raw) p /= 10; step = 10 * p
    if (raw <= 5 * p) step = 5 * p
    if (raw <= 2 * p) step = 2 * p
    if (raw <= p) step = p
    printf "set y2tics 0,%g format \"%%g%%%%\"\n", step }' "$1"
}

# gnuplot preamble of a figure of n panels (one row each), x axis log 2.
preamble() {  # out, n panels, xlabel, title
  cat <<EOF
set terminal pngcairo size 1000,$((60 + 330 * $2)) noenhanced
set output "$1"
set multiplot layout $2,1 title "$4"
set grid
set logscale x 2
set xlabel "$3"
set ylabel "GB/s of K/V read"
set y2label "% of roofline ($roofline GB/s)"
set ytics nomirror
set yrange [0:*]
set link y2 via y*100/$roofline inverse y*$roofline/100
set key outside right top
EOF
}

# The position of word $2 in the space-separated list $1 (" a b c ").
index_in() { local before=${1%% $2 *}; wc -w <<< "$before"; }

colours=("#1f77b4" "#ff7f0e" "#2ca02c" "#d62728" "#9467bd" "#8c564b" "#e377c2" "#7f7f7f"
         "#bcbd22" "#17becf")
style() {  # colour index [dash and point index] -> a line style
  echo "lw 2 ps 0.9 lc rgb \"${colours[$(($1 % 10))]}\" dt $((${2:-0} + 1)) pt $((7 - 2 * ${2:-0}))"
}

slice="$work/slice"
awk -v g="$gqa" -v t="$kv_dtype" -v d="$head_dim" '$5 == g && $6 == t && $11 == d' \
  "$work/decode" > "$slice"
what="$device decode, $hardware, GQA $gqa, head dim $head_dim, $kv_dtype KV"

# A panel per batch of the slice, x = field $2, a line per value of field $3 ("$5 VALUE"): the
# gnuplot script of figure $1 (x label $4), for the batches listed in $6.
batch_panels() {
  local out=$1 xf=$2 lf=$3 xlabel=$4 label=$5 batches=$6 b v f plot i
  preamble "$out" "$(wc -w <<< "$batches")" "$xlabel" "$what"
  xaxis "$xf" "$slice"
  for b in $batches; do
    plot="" i=0
    for v in $(awk -v b="$b" '$2 == b' "$slice" | values "$lf" /dev/stdin); do
      f="$work/panel_${xf}_${b}_${v}.dat"
      awk -v b="$b" -v v="$v" -v xf="$xf" -v lf="$lf" '$2 == b && $lf == v { print $xf, $7 }' \
        "$slice" | sort -g > "$f"
      plot+="${plot:+, }\"$f\" using 1:2 with linespoints $(style $i) title \"$label $v\""
      i=$((i + 1))
    done
    awk -v b="$b" '$2 == b' "$slice" > "$work/panel"
    pct_tics "$work/panel"
    echo "set title \"batch $b\""
    echo "plot $plot"
  done
  echo "unset multiplot"
}

if [[ -s $slice ]]; then
  # vs page size: a panel per batch, a line per context
  batch_panels "$outdir/kernels_${device}_page.png" 4 3 "page size (tokens)" context \
    "$(values 2 "$slice")" | gnuplot
  # vs context: a panel per batch with two contexts or more, a line per page size
  batches=$(awk '!seen[$2 " " $3]++ { n[$2]++ } END { for (b in n) if (n[b] > 1) print b }' \
    "$slice" | sort -g)
  if [[ -n $batches ]]; then
    batch_panels "$outdir/kernels_${device}_context.png" 3 4 "context (tokens)" page \
      "$batches" | gnuplot
  fi
  echo "wrote $outdir/kernels_${device}_page.png${batches:+ $outdir/kernels_${device}_context.png}"
fi

# ---- per GQA ratio and dtype: panels for the (batch, context) pairs with the most of them ----
awk '{ k = $2 " " $3; if (!seen[k " " $5 " " $6]++) n[k]++ }
  END { for (k in n) if (n[k] > 1) print n[k], k }' "$work/decode" |
  sort -k1,1nr -k2,2n -k3,3n | head -4 | sort -k2,2n -k3,3n > "$work/pairs"
if [[ -s $work/pairs ]]; then
  n=$(wc -l < "$work/pairs")
  {
    preamble "$outdir/kernels_${device}_gqa_dtype.png" "$n" "page size (tokens)" \
      "$device decode by GQA ratio and KV dtype, $hardware"
    xaxis 4 "$work/decode"
    # A colour per GQA ratio, a dash and point type per dtype.
    gqas=" $(values 5 "$work/decode" | paste -sd' ' -) "
    dtypes=" $(values 6 "$work/decode" | paste -sd' ' -) "
    while read -r _ b c; do
      plot=""
      while read -r g t; do
        f="$work/gd_${b}_${c}_${g}_${t}.dat"
        awk -v b="$b" -v c="$c" -v g="$g" -v t="$t" '$2 == b && $3 == c && $5 == g && $6 == t {
          print $4, $7 }' "$work/decode" | sort -g > "$f"
        plot+="${plot:+, }\"$f\" using 1:2 with linespoints"
        plot+=" $(style "$(index_in "$gqas" "$g")" "$(index_in "$dtypes" "$t")") title \"GQA $g $t\""
      done < <(awk -v b="$b" -v c="$c" '$2 == b && $3 == c && !seen[$5 " " $6]++ { print $5, $6 }' \
        "$work/decode" | sort -k2,2 -k1,1n)
      awk -v b="$b" -v c="$c" '$2 == b && $3 == c' "$work/decode" > "$work/panel"
      pct_tics "$work/panel"
      echo "set title \"batch $b, context $c\""
      echo "plot $plot"
    done < "$work/pairs"
    echo "unset multiplot"
  } | gnuplot
  echo "wrote $outdir/kernels_${device}_gqa_dtype.png"
fi

# ---- prefill: TFLOP/s and dense/paged time vs page size, a line per context, GQA and dtype ----
if [[ -s $work/prefill ]]; then
  series=$(awk '!seen[$2 " " $3 " " $5 " " $6]++ { print $2, $3, $5, $6 }' "$work/prefill" |
    sort -k1,1n -k2,2n -k3,3n)
  {
    cat <<EOF
set terminal pngcairo size 1000,720 noenhanced
set output "$outdir/kernels_${device}_prefill.png"
set multiplot layout 2,1 title "$device prefill (causal), $hardware"
set grid
set logscale x 2
set xlabel "page size (tokens)"
$(xaxis 4 "$work/prefill")
set key outside right top
EOF
    plot_tf="" plot_r="" i=0
    while read -r b c g t; do
      f="$work/pf_${b}_${c}_${g}_${t}.dat"
      awk -v b="$b" -v c="$c" -v g="$g" -v t="$t" '$2 == b && $3 == c && $5 == g && $6 == t {
        print $4, $10, $9 }' "$work/prefill" | sort -g > "$f"
      title="batch $b, context $c, GQA $g $t"
      plot_tf+="${plot_tf:+, }\"$f\" using 1:2 with linespoints $(style $i) title \"$title\""
      plot_r+="${plot_r:+, }\"$f\" using 1:3 with linespoints $(style $i) title \"$title\""
      i=$((i + 1))
    done <<< "$series"
    echo "set title 'TFLOP/s'; set ylabel 'TFLOP/s'; set yrange [0:*]"
    echo "plot $plot_tf"
    echo "set title 'dense time / paged time (1 = paging costs nothing)'"
    echo "set ylabel 'dense / paged'; set yrange [*:*]"
    echo "plot $plot_r, 1 with lines dt 2 lc rgb '#777777' notitle"
    echo "unset multiplot"
  } | gnuplot
  echo "wrote $outdir/kernels_${device}_prefill.png"
fi
