# issue 31: the decode layer's GEMM chain, cuBLAS against Triton skinny GEMMs with / without PDL (and L2 prefetch)
source .gpu/setup.sh
python -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)"
start=$(date +%s)
timeout 330 python benchmarks/decode_pdl.py --model 1.5B --rows 1,8,64 --out $OUT/decode_pdl_1.5b.json 2>&1 | tail -20
echo "1.5B done after $(( $(date +%s) - start )) s"
timeout $(( 560 - ($(date +%s) - start) )) python benchmarks/decode_pdl.py --model 7B --rows 8,64 --out $OUT/decode_pdl_7b.json 2>&1 | tail -8
echo "all done after $(( $(date +%s) - start )) s"
