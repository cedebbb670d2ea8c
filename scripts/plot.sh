#!/usr/bin/env bash
# Plots of `pagedattn bench serve` results (gnuplot, PNG):
#   scripts/plot.sh SUMMARY.csv [TIMELINE.csv] [OUTDIR]
# SUMMARY.csv (--csv) gives, per series (mode and prefix cache):
#   OUTDIR/serve_throughput.png  output tokens/s vs request rate
#   OUTDIR/serve_latency.png     TTFT p50/p99 and end-to-end p99 vs request rate
# TIMELINE.csv (--timeline-csv) gives OUTDIR/serve_kv_usage.png: KV tokens allocated and live over
# time, one panel per request rate (at most 4, the highest rates).
# OUTDIR defaults to the folder of SUMMARY.csv. Installs gnuplot-nox when gnuplot is missing.
set -euo pipefail

if [[ $# -lt 1 || ! -f $1 ]]; then
  echo "usage: $0 SUMMARY.csv [TIMELINE.csv] [OUTDIR]" >&2
  exit 2
fi
summary=$1
timeline=${2:-}
outdir=${3:-$(dirname "$summary")}
mkdir -p "$outdir"

bash "$(dirname "$0")/ensure-gnuplot.sh"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Columns of the summary by header name, so the script survives new columns.
col() { head -1 "$summary" | tr ',' '\n' | grep -nx "$1" | cut -d: -f1; }
c_mode=$(col mode); c_pc=$(col prefix_cache); c_rate=$(col request_rate)
c_out=$(col output_tokens_per_s); c_t50=$(col ttft_p50); c_t99=$(col ttft_p99)
c_e99=$(col e2e_p99); c_tp50=$(col tpot_p50)

# Rates in order of first appearance become x positions 0, 1, ...; "inf" stays a label.
awk -F, -v cr="$c_rate" 'NR > 1 && !seen[$cr]++ { print $cr }' "$summary" > "$work/rates"
xtics=$(awk '{ printf "%s\"%s\" %d", (NR > 1 ? ", " : ""), $1, NR - 1 }' "$work/rates")
series=()
while IFS= read -r s; do series+=("$s"); done < <(
  awk -F, -v cm="$c_mode" -v cp="$c_pc" 'NR > 1 { k = $cm (($cm == "paged") ? " prefix-" $cp : "")
    if (!seen[k]++) print k }' "$summary")
for s in "${series[@]}"; do
  awk -F, -v cm="$c_mode" -v cp="$c_pc" -v cr="$c_rate" -v s="$s" \
    -v a="$c_out" -v b="$c_t50" -v c="$c_t99" -v d="$c_e99" -v e="$c_tp50" '
    NR == FNR { idx[$1] = FNR - 1; next }
    FNR > 1 { k = $cm (($cm == "paged") ? " prefix-" $cp : "")
      if (k == s) print idx[$cr], $a, $b, $c, $d, $e }' "$work/rates" "$summary" |
    sort -n > "$work/${s// /_}.dat"
done

plot_series() {  # column expression, title suffix
  local first=1
  for s in "${series[@]}"; do
    [[ $first -eq 0 ]] && printf ', '
    printf '"%s" using 1:%s with linespoints lw 2 pt 7 title "%s%s"' \
      "$work/${s// /_}.dat" "$1" "$s" "$2"
    first=0
  done
}

gnuplot <<EOF
set terminal pngcairo size 1000,560 noenhanced
set grid
set key top left
set xtics ($xtics)
set xlabel "request rate (requests/s)"
set output "$outdir/serve_throughput.png"
set title "Output throughput vs request rate (equal KV memory)"
set ylabel "output tokens/s"
set yrange [0:*]
plot $(plot_series 2 "")
set output "$outdir/serve_latency.png"
set title "Latency vs request rate"
set ylabel "seconds (log)"
set logscale y
set yrange [*:*]
set key outside right top
plot $(plot_series 3 " TTFT p50"), $(plot_series 4 " TTFT p99"), $(plot_series 5 " E2E p99")
EOF
echo "wrote $outdir/serve_throughput.png $outdir/serve_latency.png"

if [[ -n $timeline && -f $timeline ]]; then
  # Panels: the highest rates (up to 4), each with allocated and live KV per series.
  awk -F, 'NR > 1 && !seen[$3]++ { print $3 }' "$timeline" |
    sort -g | tail -4 > "$work/trates"
  npanels=$(wc -l < "$work/trates")
  {
    echo "set terminal pngcairo size 1000,$((300 * npanels)) noenhanced"
    echo "set output \"$outdir/serve_kv_usage.png\""
    echo "set multiplot layout $npanels,1"
    echo "set grid; set key top right; set xlabel 'time (s)'; set ylabel 'KV tokens'"
    while IFS= read -r r; do
      echo "set title 'KV memory over time at request rate $r'"
      plot=""
      while IFS= read -r s; do
        f="$work/tl_${r}_${s// /_}.dat"
        awk -F, -v r="$r" -v s="$s" 'NR > 1 && $3 == r {
          k = $1 (($1 == "paged") ? " prefix-" $2 : ""); if (k == s) print $4, $5, $6 }' \
          "$timeline" > "$f"
        [[ -s $f ]] || continue
        plot+="${plot:+, }\"$f\" using 1:2 with steps lw 2 title \"$s allocated\""
        plot+=", \"$f\" using 1:3 with lines dt 2 lw 1 title \"$s live\""
      done < <(awk -F, 'NR > 1 { k = $1 (($1 == "paged") ? " prefix-" $2 : ""); if (!seen[k]++) print k }' "$timeline")
      echo "plot $plot"
    done < "$work/trates"
    echo "unset multiplot"
  } | gnuplot
  echo "wrote $outdir/serve_kv_usage.png"
fi
