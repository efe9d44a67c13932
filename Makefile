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
NATIVE := ibemu/kernel/c_src/madtwin
native: $(NATIVE)
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
	-$(VENV)/bin/ibemu clean
