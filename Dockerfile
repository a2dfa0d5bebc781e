# Route (c) of docs/install.md: verl 0.9.1 and entropyrl on verl's own stable vLLM image. Its
# torch 2.11.0, vLLM 0.24.0 and flash-attn 2.8.3 (CUDA 13.0) are verl 0.9.1's pins; they are
# frozen into a constraints file first, so that nothing below replaces them.
#   docker build -t entropyrl:gpu .
ARG BASE_IMAGE=verlai/verl:vllm024.dev2
FROM ${BASE_IMAGE}

WORKDIR /opt/entropyrl
COPY . /opt/entropyrl

RUN python tools/stack_constraints.py > /opt/stack-constraints.txt \
    && cat /opt/stack-constraints.txt \
    && pip install --no-cache-dir -c /opt/stack-constraints.txt "verl[verl-core]==0.9.1" \
    && pip install --no-cache-dir -c /opt/stack-constraints.txt -e ".[preinstalled]" \
    && python tools/stack_constraints.py > /dev/null \
    && python -c "import flash_attn, vllm, verl, entropyrl.verl.plugin" \
    && entropyrl doctor --discovery --quick

CMD ["entropyrl", "doctor"]
