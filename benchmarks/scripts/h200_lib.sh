# Sourced by h200_call1.sh / h200_call2.sh: stages under one deadline, re-packing $OUT after each.
# Needs DEADLINE, LOG, RES, OUT and PACK (the tarball's name under $OUT).
left() { echo $(( DEADLINE - SECONDS > 5 ? DEADLINE - SECONDS : 5 )); }
pack() { tar -czf "$OUT/$PACK" -C "$RES" . 2>/dev/null; }
stage() {   # stage NAME LIMIT_S CMD...: run with a limit (never past the deadline), log, re-pack
  local name=$1 limit=$2; shift 2
  (( limit > $(left) )) && limit=$(left)
  echo "== $name (limit ${limit}s, t=${SECONDS}s)" | tee -a "$LOG"
  timeout "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "== $name rc=$rc (t=${SECONDS}s)" | tee -a "$LOG"
  (( rc == 0 )) || failed+=("$name")
  pack
}
provenance() {  # the commit and how far the copied tree is from it (a device copy's .git can be stale)
  echo "HEAD $(git -C "$1" rev-parse HEAD 2>/dev/null) + $(git -C "$1" status --porcelain 2>/dev/null | wc -l) changed paths"
}
failed=()
