#!/usr/bin/env bash
# Keeps the crate's modules layered: each module may use only the modules listed before
# it (see docs/architecture.md). Fails, naming the file and line, on any `crate::<m>`
# path that points to a later module. Run by .ci/run; `scripts/layers.sh --self-test`
# shows that it catches a violation.
set -euo pipefail
cd "$(dirname "$0")/.."
ORDER=(cards cluster ledger snapshot decide admission routing live controller webhook cli)

check() { # root: a src/ tree to check
  local root=$1 bad=0 i j
  for i in "${!ORDER[@]}"; do
    local m=${ORDER[$i]} later=()
    for j in "${!ORDER[@]}"; do [ "$j" -gt "$i" ] && later+=("${ORDER[$j]}"); done
    [ ${#later[@]} -eq 0 ] && continue
    local files=()
    [ -d "$root/$m" ] && while IFS= read -r f; do files+=("$f"); done < <(find "$root/$m" -name '*.rs')
    [ -f "$root/$m.rs" ] && files+=("$root/$m.rs")
    [ ${#files[@]} -eq 0 ] && { echo "layers: module $m not found under $root"; bad=1; continue; }
    local pat
    pat="crate::($(IFS='|'; echo "${later[*]}"))\\b"
    if grep -nE "$pat" "${files[@]}"; then
      echo "layers: $m must not use ${later[*]} (order: ${ORDER[*]})"
      bad=1
    fi
  done
  # Grouped paths (`crate::{a::X, b::Y}`) would hide a module from the check above.
  if grep -rn 'crate::{' "$root"; then echo "layers: write one path per use (crate::m::...)"; bad=1; fi
  # Every top-level module is in the order.
  for f in "$root"/*; do
    local name
    name=$(basename "$f" .rs)
    case "$name" in lib|bin) continue ;; esac  # bin/: the binary, on top of everything
    [[ " ${ORDER[*]} " == *" $name "* ]] || { echo "layers: module $name is not in the order"; bad=1; }
  done
  return $bad
}

if [ "${1:-}" = "--self-test" ]; then
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  cp -r src "$tmp/src"
  echo "// a violation planted by the self-test" >> "$tmp/src/cards/mod.rs"
  echo "use crate::decide::Config;" >> "$tmp/src/cards/mod.rs"
  if check "$tmp/src" >/dev/null; then echo "layers self-test: a planted cards -> decide use was NOT caught"; exit 1; fi
  echo "layers self-test: a planted cards -> decide use is caught"
  exit 0
fi
check src && echo "layers: ok (${ORDER[*]})"
