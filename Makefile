# The README's two commands: `sudo make run` and `sudo make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup run demo test lint bench clean bpf native
setup:
	IBEMU_VENV=$(VENV) scripts/setup.sh

# The device firmware's eBPF programs (C, clang -target bpf, libbpf's headers only).
BPF_OBJS := ibemu/kernel/bpf_src/sma.o ibemu/kernel/bpf_src/notice.o ibemu/kernel/bpf_src/notice_tx.o
MULTIARCH := $(shell gcc -print-multiarch 2>/dev/null || echo $$(uname -m)-linux-gnu)
bpf: $(BPF_OBJS)
$(BPF_OBJS): ibemu/kernel/bpf_src/frame.h
ibemu/kernel/bpf_src/sma.o ibemu/kernel/bpf_src/notice_tx.o: ibemu/kernel/bpf_src/crc.h
ibemu/kernel/bpf_src/%.o: ibemu/kernel/bpf_src/%.c
	clang -O2 -g0 -target bpf -I/usr/include -I/usr/include/$(MULTIARCH) -Wall -c $< -o $@

# The C twin of OpenSM's MAD-socket hot path (ibemu/kernel/madtwin.py): plain C, libc only.
# And the link model and the forwarder compiled with mypyc (ibemu/native.py; the sources run where it is not
# built): with the venv's Python, or NATIVE_PY=... (a Python with mypy), skipped without one.
NATIVE := ibemu/kernel/c_src/madtwin
NATIVE_PY ?= $(PY)
MYPYC_SRC := ibemu/physics/qos.py ibemu/physics/link.py ibemu/physics/model.py ibemu/physics/live.py \
	ibemu/agents/lft.py ibemu/agents/forwarder.py ibemu/fabric/linkframes.py \
	ibemu/kernel/fib.py ibemu/roce/userplane.py ibemu/roce/linkframes.py
native: $(NATIVE) build/mypyc/stamp
build/mypyc/stamp: $(MYPYC_SRC) scripts/build_native.py ibemu/native.py
	@if [ -x "$(NATIVE_PY)" ]; then $(NATIVE_PY) scripts/build_native.py >/dev/null && mkdir -p build/mypyc && touch $@; \
	else echo "native: no $(NATIVE_PY): the hot path runs interpreted (NATIVE_PY=... to build it)"; fi
ibemu/kernel/c_src/%: ibemu/kernel/c_src/%.c
	$(CC) -O2 -Wall -Wextra -o $@ $<

run: setup
	$(VENV)/bin/ibemu run

demo: setup
	$(VENV)/bin/ibemu demo

test: setup
	$(PY) -m pytest -q

lint: setup
	$(PY) -m pip install -q -e '.[lint]' 2>/dev/null
	$(PY) -m ruff check ibemu tests benchmarks
	$(PY) -m mypy ibemu
	$(VENV)/bin/lint-imports

bench: setup
	for b in benchmarks/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	-rm -f $(BPF_OBJS) $(NATIVE)
	-[ -x "$(PY)" ] && $(PY) scripts/build_native.py --clean
	-$(VENV)/bin/ibemu clean
