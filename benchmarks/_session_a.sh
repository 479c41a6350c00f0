# temporary (not committed): diagnostics for issue 22 item 5, then issue 23's GPU tests
set -u
B=benchmarks/device.sh
echo "== probe"; TIMEOUT=150 bash $B script probe_hotpath > $OUT/probe.txt 2>&1; tail -3 $OUT/probe.txt
echo "== profile"; TIMEOUT=120 bash $B script overhead --profile > $OUT/profile.txt 2>&1; tail -2 $OUT/profile.txt
echo "== nofast"; FLASHINFER_TRITON_FAST_LAUNCH=0 TIMEOUT=60 bash $B script overhead --rows rmsnorm,sampling,single_decode --out $OUT/overhead_nofast.jsonl > /dev/null 2>&1; cat $OUT/overhead_nofast.jsonl | cut -c1-200
echo "== compat"; TIMEOUT=200 bash $B tests tests/attention/test_compat_gpu.py
