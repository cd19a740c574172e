#!/bin/sh
# run_inputs.sh DIR: writes the `mlagen run --inputs` files the CLI tests read, for the
# model tests/data/run/tiny.json (H 2, d_c 32, d_r 16, d_n 16, d_v 16) with B 1, S 4:
#   good.safetensors       q [1,4,2,32] c_kv [1,4,32] k_rope [1,4,16] w_kv_b [64,32]
#                          do [1,4,2,16], f32
#   missing.safetensors    the same without do
#   shape.safetensors      k_rope [1,4,8] instead of [1,4,16]
#   truncated.safetensors  good.safetensors less its last 100 bytes
# Values repeat 0.25, -0.5, 0.125, 0.375 (the tests exercise the input path, not numerics).
set -eu
dir=$1
mkdir -p "$dir"

# le64 N: N as 8 little-endian bytes (N < 65536).
le64() {
  printf "\\$(printf %03o $(($1 % 256)))\\$(printf %03o $(($1 / 256)))\\000\\000\\000\\000\\000\\000"
}

# floats N: N f32 values of the repeating pattern.
floats() {
  n=$1
  while [ "$n" -ge 4 ]; do
    printf '\000\000\200\076\000\000\000\277\000\000\000\076\000\000\300\076'
    n=$((n - 4))
  done
}

# write FILE "name:dtype_dims ..." : one f32 tensor per word name=d0,d1,... in order
write() {
  file=$1
  shift
  header="{"
  off=0
  sep=""
  for spec in "$@"; do
    name=${spec%%=*}
    dims=${spec#*=}
    n=1
    for d in $(echo "$dims" | tr ',' ' '); do n=$((n * d)); done
    end=$((off + 4 * n))
    header="$header$sep\"$name\":{\"dtype\":\"F32\",\"shape\":[$dims],\"data_offsets\":[$off,$end]}"
    sep=","
    off=$end
  done
  header="$header}"
  # pad the header with spaces to a multiple of 8 bytes
  while [ $((${#header} % 8)) -ne 0 ]; do header="$header "; done
  {
    le64 ${#header}
    printf '%s' "$header"
    for spec in "$@"; do
      dims=${spec#*=}
      n=1
      for d in $(echo "$dims" | tr ',' ' '); do n=$((n * d)); done
      floats $n
    done
  } > "$file"
}

write "$dir/good.safetensors" q=1,4,2,32 c_kv=1,4,32 k_rope=1,4,16 w_kv_b=64,32 do=1,4,2,16
write "$dir/missing.safetensors" q=1,4,2,32 c_kv=1,4,32 k_rope=1,4,16 w_kv_b=64,32
write "$dir/shape.safetensors" q=1,4,2,32 c_kv=1,4,32 k_rope=1,4,8 w_kv_b=64,32 do=1,4,2,16
size=$(wc -c < "$dir/good.safetensors")
head -c $((size - 100)) "$dir/good.safetensors" > "$dir/truncated.safetensors"
