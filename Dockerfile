# The training image: the official PyTorch CUDA runtime plus the pinned requirements and this
# repository (installed editable at /project, so the code and config volumes of .neuro/live.yml
# mounted over /project/src and /project/configs take effect without a rebuild).
#
#   neuro-flow build myimage                                  # on the platform (.neuro/live.yml)
#   docker build -t distqa .                                  # locally
#   docker build --build-arg BASE_IMAGE=my/torch:tag -t distqa .   # another base with torch==2.13.0
#
# The base must already hold the torch of requirements.txt (pip then keeps it instead of fetching
# another build) and python >= 3.11 with pip on PATH. No credentials or keys belong in this image:
# the platform mounts storage and passes secrets to jobs at run time.
#
# torch 2.13.0 images are published as pytorch/pytorch:2.13.0-cuda{12.6,13.0,13.2}-cudnn9-runtime
# (Docker Hub, also ghcr.io/pytorch/pytorch); no public Dockerfile uses a cuda12.8 one.
# CUDA 12.6 needs an NVIDIA driver of the CUDA 12 series on the GPU nodes: >= 525.60.13 through
# CUDA's minor-version compatibility, >= 560.28.03 for every 12.6 feature (`nvidia-smi` shows the
# node's driver). For nodes with a CUDA 13 driver (>= 580) the cuda13.0 tag works the same way.
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda12.6-cudnn9-runtime
FROM ${BASE_IMAGE}

# Jupyter for the `jupyter` job; empty to leave it out (the test image does).
ARG JUPYTER_REQUIREMENT=jupyterlab==4.6.6
ARG USER_UID=1000

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HOME=/project/cache/huggingface

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /project

# project.toml's [image]: the project's own Debian packages and Python requirements (a fork sets them there, never
# here: this file is the template's). src/distqa/upkeep/project.py reads it with the standard library alone.
COPY requirements.txt project.toml ./
COPY src/distqa/upkeep/project.py ./src/distqa/upkeep/project.py
RUN packages="$(python src/distqa/upkeep/project.py image.apt)" \
    && if [ -n "$packages" ]; then \
        apt-get update && xargs apt-get install -y --no-install-recommends <<< "$packages" \
        && rm -rf /var/lib/apt/lists/*; fi
RUN python src/distqa/upkeep/project.py image.python > /tmp/project-requirements.txt \
    && python -m pip install --no-cache-dir -r requirements.txt -r /tmp/project-requirements.txt ${JUPYTER_REQUIREMENT} \
    && python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

COPY pyproject.toml README.md ./
COPY src ./src
COPY configs ./configs
COPY scripts ./scripts
COPY data/tiny-bert ./data/tiny-bert
# The worked example of a fork's task (docs/FORKING.md); /project on PYTHONPATH makes a package beside src/
# importable in every job (a fork's package under src/ is importable through the editable install).
COPY examples ./examples
ENV PYTHONPATH=/project
# The image runs as root: on the platform, results/ and cache/ are storage folders mounted with the
# owner the storage service gives them (root, mode 755, in practice) and `apolo run` cannot choose
# the user, so a uid-1000 job could not write its checkpoints. scripts/worker.sh and in_job.sh stop
# at start, naming the folder, when one is not writable. For local runs as a plain user, the
# `distqa` user (uid USER_UID) owns /project's writable places: `docker run --user 1000 ...`.
RUN python -m pip install --no-cache-dir --no-deps -e . \
    && useradd --create-home --uid "${USER_UID}" --shell /bin/bash distqa \
    && mkdir -p results cache/huggingface \
    && chown -R distqa /project
# Jobs name their own command (.neuro/live.yml); alone, the image prints how to start a node.
CMD ["bash", "scripts/worker.sh", "--help"]
