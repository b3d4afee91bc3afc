#!/usr/bin/env bash
# The HTML report renders in headless Chromium: the chart's SVG with the
# peak label is there, the script ran without errors, the screenshot is not
# blank, and nothing is fetched.
set -euo pipefail
metamem=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$metamem" profile --model mlp --batch 4 --device cuda --optimizer adam --html "$dir/report.html" > /dev/null
[ -s "$dir/report.html" ] || fail "no report written"
if grep -q -E 'https?://' "$dir/report.html"; then fail "the page references the network"; fi

chromium=(chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1200,1600)
"${chromium[@]}" --dump-dom "file://$dir/report.html" > "$dir/dom.html" 2> /dev/null
grep -q '<svg id="timeline"' "$dir/dom.html" || fail "no timeline chart"
grep -q 'id="peak-label"[^>]*>peak ' "$dir/dom.html" || fail "no peak label"
grep -q 'data-rendered="true"' "$dir/dom.html" || fail "the page's script did not finish"
if grep -q 'data-errors=' "$dir/dom.html"; then fail "the page logged errors: $(grep -o 'data-errors="[^"]*"' "$dir/dom.html")"; fi

"${chromium[@]}" --screenshot="$dir/report.png" "file://$dir/report.html" > /dev/null 2>&1
size=$(stat -c %s "$dir/report.png")
# A blank 1200x1600 page compresses to a few KiB; the drawn one is far larger.
[ "$size" -gt 40000 ] || fail "the screenshot looks blank ($size bytes)"

"$metamem" checkpoint --model mlp --batch 4 --device cuda --budget 1GiB --html "$dir/checkpoint.html" > /dev/null
grep -q '<svg id="checkpoint-curve"' "$dir/checkpoint.html" || fail "no memory-recompute curve in the checkpoint report"
echo "html report: ok (screenshot $size bytes)"
