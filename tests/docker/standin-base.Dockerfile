# Test only: a stand-in for the official PyTorch image, for machines that reach no image registry.
# Debian (debootstrap, imported as STANDIN_DEBIAN) + a venv on PATH holding the CPU build of the
# pinned torch, as the official image holds its CUDA build; pip trusts the host's CA bundle.
ARG STANDIN_DEBIAN=distqa-standin-debian:bookworm
FROM ${STANDIN_DEBIAN}
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY wheelhouse /tmp/wheelhouse
ARG TORCH_REQUIREMENT=torch==2.13.0
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheelhouse "${TORCH_REQUIREMENT}" \
    && rm -rf /tmp/wheelhouse
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    LANG=C.UTF-8
