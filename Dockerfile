# Ghosted demo: the Streamlit app on a small CPU machine (a Hugging Face Docker Space on
# "CPU basic", 2 vCPU / 16 GB, or any Docker host). See docs/DEPLOY.md.
#   docker build -t ghosted-demo .
#   docker run --rm -p 8501:8501 ghosted-demo        # then open http://localhost:8501
FROM python:3.11-slim-bookworm

# curl for the health check; nothing else comes from apt.
RUN apt-get update \
    && apt-get install -y --no-install-recommends curl \
    && rm -rf /var/lib/apt/lists/*

# Spaces run the container as uid 1000; build and run as that user so every file is theirs.
RUN useradd -m -u 1000 user
USER user
ENV HOME=/home/user \
    PATH=/home/user/app/.venv/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1
RUN mkdir -p $HOME/app  # made by the user: WORKDIR alone may create it owned by root
WORKDIR $HOME/app

# Dependencies first (cached while only the code changes), with the same script as a workstation.
# The extra index makes `torch==2.13.0` resolve to the CPU build instead of a multi-GB CUDA one.
COPY --chown=user requirements.txt ./
COPY --chown=user scripts/install.sh scripts/install.sh
RUN PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/install.sh

COPY --chown=user . .
RUN bash scripts/install.sh  # again, now with the code: installs ghosted itself (the rest is there)

# Public-demo limits (ghosted/service/deploy.py), no network at run time, two CPU threads for 2 vCPU.
ENV GHOSTED_DEMO=1 \
    HF_HUB_OFFLINE=1 \
    HF_DATASETS_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false \
    OMP_NUM_THREADS=2 \
    STREAMLIT_SERVER_MAX_UPLOAD_SIZE=5 \
    STREAMLIT_CLIENT_SHOW_ERROR_DETAILS=type

# Convert the bundled GGUF and clean the bundled texts now (CPU only, ~30 s) rather than on the
# first visit after every restart: the converted copy lives in ~/.cache/ghosted inside the image.
RUN python -c "from ghosted.models.loading import load_model; \
from ghosted.data.windows import calibration_windows, evaluation_windows; \
lm = load_model(device='cpu'); \
calibration_windows(lm.tokenizer, 'bundled:news', 8, 128); \
evaluation_windows(lm.tokenizer, 'bundled:wiki', 1024, 256); \
print('ghosted: bundled model and texts ready')"

# Answers before anyone asks: the influence report at the Influence page's defaults, the presets' runs
# (their calibration statistics) and their evaluations, stored in ~/.cache/ghosted for every visitor
# (docs/DEPLOY.md; a few minutes on 2 CPUs).
RUN python scripts/precompute.py

EXPOSE 8501
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD curl --fail http://localhost:8501/_stcore/health || exit 1
CMD ["streamlit", "run", "app.py", "--server.port=8501", "--server.address=0.0.0.0"]
