# issue 31: speculation when a decode step is GPU-bound and the text repeats: a random-weight Qwen2.5-1.5B decoding
# greedily (random weights fall into repeating cycles), 16 sequences (all within the speculation threshold), off vs on
source .gpu/setup.sh
start=$(date +%s)
python -c "from hybridrl.assets.tiny_model import write_size_preset; write_size_preset('/tmp/m15', 'qwen2.5-1.5b')"
echo "model after $(( $(date +%s) - start )) s"
timeout $(( 215 - ($(date +%s) - start) )) python benchmarks/spec_decode.py --model /tmp/m15 --num-prompts 16 --n 1 \
  --max-tokens 1024 --temperature 0 --repeat 3 --workdir /tmp/sg --out $OUT/spec_decode_greedy_1.5b.json > $OUT/spec_decode_greedy_1.5b.log 2>&1
echo "rc=$? after $(( $(date +%s) - start )) s"; grep "\[spec_decode\]" $OUT/spec_decode_greedy_1.5b.log | tail -3 | cut -c1-600
