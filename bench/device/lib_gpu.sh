# bench/device/lib_gpu.sh — sourced by the device scripts that need a GPU (score.sh, prefix.sh, quant.sh,
# prefix_serve.sh, spec.sh).
#
# need_gpu NAME: without an NVIDIA GPU, says so and exits the script with 77 (skipped); with
# one, prints "NAME: <GPU>, commit <the build's commit>".
need_gpu() {
    if ! nvidia-smi -L >/dev/null 2>&1; then
        echo "$1: no NVIDIA GPU on this machine (nvidia-smi found none): nothing to measure; run it on the GPU host"
        exit 77
    fi
    echo "$1: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), commit $(cat .devcommit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)"
}
