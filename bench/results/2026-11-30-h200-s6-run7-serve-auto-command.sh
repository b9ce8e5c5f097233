#!/bin/bash
# session 6, call 7: serve smoke with the default --precision auto (fp16x3 on an H200), plain graphs.
# Run as: ln -s ../server streamdec/server; ln -s ../clients streamdec/clients; bash THIS 3b12e09
# (the links give the layout `pip install -e .` makes, which the serve and stream subcommands import from)
C=$1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD TORCHINDUCTOR_COMPILE_THREADS=1 STREAMDEC_COMMIT=$C
t0=$(date +%s)
python3 -c "import numpy as np; np.save('/tmp/z.npy', np.random.default_rng(6).standard_normal((200, 64)).astype(np.float32))"
STREAMDEC_NO_COMPILE=1 python3 -m streamdec.cli serve --device cuda --codec auk-24k --port 8765 > $OUT/server.log 2>&1 &
SP=$!
for i in $(seq 1 110); do grep -q "serving codec" $OUT/server.log && break; sleep 1; done
echo "server up after $(( $(date +%s) - t0 ))s"; cat $OUT/server.log
timeout 60 python3 -m streamdec.cli stream /tmp/z.npy /tmp/o.wav --url ws://127.0.0.1:8765/v1/stream --realtime > $OUT/client.log 2>&1
echo "stream rc=$?"; cat $OUT/client.log
timeout 60 python3 -m streamdec.cli decode /tmp/z.npy /tmp/off.wav --device cuda --codec auk-24k > $OUT/offline.log 2>&1
echo "offline rc=$?"; cat $OUT/offline.log
python3 - <<'PY' | tee $OUT/compare.txt
import wave, numpy as np
def read(p):
    with wave.open(p) as w:
        return np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16).astype(np.int32)
a, b = read("/tmp/o.wav"), read("/tmp/off.wav")
print("samples", a.size, b.size, "max int16 diff (stream, auto precision, vs offline fp32)", int(np.abs(a - b).max()) if a.size == b.size else "sizes differ")
PY
kill -INT $SP; wait $SP; echo "server rc=$? $(( $(date +%s) - t0 ))s"; tail -3 $OUT/server.log
