"""Where the app runs, and what it may do there: a workstation, a public demo, a classroom.

One frozen dataclass holds every limit; three presets cover the usual deployments. The app picks
one from the environment (``GHOSTED_DEPLOY=local|demo|classroom``, or the shortcut
``GHOSTED_DEMO=1``) and asks it before doing anything a deployment may forbid. Each ``check_*``
raises ``DeployRefusal`` (a ``ValueError``) whose message says what is refused and why, so a
front end can show it as a plain error.

Example:
    >>> cfg = from_env()                  # "local" unless the environment says otherwise
    >>> cfg.check_calibration(32, 256)    # fine locally; raises in the demo (cap 8192 tokens)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from ghosted.models.assets import BUNDLED_MODEL


class DeployRefusal(ValueError):
    """Something this deployment does not allow; the message says what and why."""


@dataclass(frozen=True)
class DeployConfig:
    """Limits of one deployment. ``None`` means no limit."""

    name: str = "local"  # preset name, shown in the app
    models: tuple[str, ...] | None = None  # model allow-list (source strings); None: any model
    allow_local_paths: bool = True  # model folders, .gguf files and text files on the server's disk
    allow_hub_datasets: bool = True  # calibration/evaluation text from the Hugging Face hub
    allow_trust_remote_code: bool = True  # run code shipped with a hub model (still opt-in)
    allow_model_download: bool = True  # offer the recovered model as a zip
    max_calib_tokens: int | None = None  # calibration sequences x length, held-out included
    max_eval_tokens: int | None = None  # tokens scored per perplexity
    max_upload_mb: float = 200.0  # uploaded calibration text (matches server.maxUploadSize)
    max_new_tokens: int = 200  # longest sample generation
    max_prompts: int | None = None  # prompts of one generation
    max_prompt_chars: int | None = None  # characters of one prompt
    max_job_gb: float | None = None  # estimated peak memory of one job (ghosted.service.cost), weights not counted
    max_job_tflop: float | None = None  # estimated compute of one job, in 10**12 floating-point operations
    max_visitor_jobs: int | None = None  # jobs one visitor may have queued or running at once
    max_visitor_gb: float | None = None  # estimated memory of those jobs together
    model_dtype: str | None = None  # the one dtype the shared model is loaded in; None: the visitor's choice
    model_device: str | None = None  # the one device it is loaded on; None: the visitor's choice
    max_probe_tokens: int | None = None  # tokens read by the token view or the lens (one pass per variant)
    allow_costly_criteria: bool = True  # influence criteria with a pass per layer or a backward pass
    # (removal perplexity, Taylor+, SLEB): minutes per layer set on a small shared CPU
    stats_cache_gb: float | None = None  # calibration statistics kept on disk, shared by every session;
    # None: $GHOSTED_STATS_CACHE_GB or the cache's default (20 GB)
    shared_results: int = 64  # results (reports, fitted runs, evaluations) kept in memory for every session
    idle_release_s: float | None = None  # a result no one read for this long is released (recomputed,
    # or read from disk, when someone asks again); None: kept until ``shared_results`` pushes it out

    @property
    def is_restricted(self) -> bool:
        """True for any preset that narrows what a workstation may do."""
        return self != LOCAL

    def check_model(self, source: str, kind: str, trust_remote_code: bool = False) -> None:
        """Refuse a model outside the allow-list, a local path, or remote code where not allowed.

        ``kind`` is ``ghosted.models.loading.source_kind(source)``: bundled, folder, gguf or hub.
        """
        if kind in ("folder", "gguf") and not self.allow_local_paths:
            raise DeployRefusal(f"The {self.name} deployment does not load models from the server's "
                                f"disk ({source}). Choose one of: {', '.join(self.allowed_models())}.")
        if self.models is not None and source not in self.models and not (
                kind == "bundled" and BUNDLED_MODEL in self.models):
            raise DeployRefusal(f"{source} is not offered in the {self.name} deployment. Choose one "
                                f"of: {', '.join(self.allowed_models())}.")
        if trust_remote_code and not self.allow_trust_remote_code:
            raise DeployRefusal(f"The {self.name} deployment never runs code shipped with a model "
                                "(trust_remote_code is off).")

    def check_source(self, source: str, trust_remote_code: bool = False) -> None:
        """``check_model`` for a model named by its source alone (the kind is found here); a missing
        path is refused as a local path where those are off, as unloadable otherwise."""
        from ghosted.models.loading import ModelLoadError, source_kind

        try:
            kind = source_kind(source)
        except ModelLoadError:  # a missing path: say "no local paths here" first where that applies
            if self.allow_local_paths:
                raise
            kind = "folder"
        self.check_model(source, kind, trust_remote_code)

    def check_text_source(self, source: str) -> None:
        """Refuse a local text file or a hub dataset where the deployment forbids them. Without local paths,
        only a bundled text's name or a dataset name that cannot be a path is taken (uploads come as text)."""
        from ghosted.data.sources import is_hub_dataset_name, list_bundled_sources

        name = source.strip()
        if name in list_bundled_sources():
            return
        if not self.allow_local_paths and not is_hub_dataset_name(name):
            raise DeployRefusal(f"The {self.name} deployment does not read files on the server ({name}). Use a "
                                "bundled text, upload a .txt or .jsonl file"
                                + (", or name a hub dataset (wikitext-2-raw-v1, c4, ptb or hf:OWNER/NAME)."
                                   if self.allow_hub_datasets else "."))
        if name.lower().endswith((".txt", ".jsonl")) or Path(name).expanduser().is_absolute():
            return
        if not self.allow_hub_datasets:
            raise DeployRefusal(f"The {self.name} deployment does not fetch datasets ({name}). Use a "
                                "bundled text or upload a .txt or .jsonl file.")

    def check_calibration(self, calib_seqs: int, seq_len: int, heldout_seqs: int = 0) -> None:
        """Refuse a calibration larger than ``max_calib_tokens`` (the arguments: the spec's settings)."""
        tokens = (calib_seqs + heldout_seqs) * seq_len
        cap = self.max_calib_tokens
        if cap is not None and tokens > cap:
            raise DeployRefusal(f"{calib_seqs + heldout_seqs} sequences x {seq_len} tokens = {tokens:,} "
                                f"calibration tokens; the {self.name} deployment allows at most "
                                f"{cap:,}. Lower the sequences or the sequence length.")

    def check_eval(self, tokens: int) -> None:
        """Refuse an evaluation larger than ``max_eval_tokens``."""
        cap = self.max_eval_tokens
        if cap is not None and tokens > cap:
            raise DeployRefusal(f"{tokens:,} evaluation tokens; the {self.name} deployment allows "
                                f"at most {cap:,}.")

    def check_upload(self, n_bytes: int) -> None:
        """Refuse an empty upload or one above ``max_upload_mb``."""
        if n_bytes == 0:
            raise DeployRefusal("The uploaded file is empty.")
        if n_bytes > self.max_upload_mb * 2**20:
            raise DeployRefusal(f"The upload is {n_bytes / 2**20:.1f} MB; the {self.name} deployment "
                                f"accepts at most {self.max_upload_mb:g} MB.")

    def check_generation(self, max_new_tokens: int, prompts=()) -> None:
        """Refuse generations longer than ``max_new_tokens``, more than ``max_prompts`` prompts, or a prompt
        longer than ``max_prompt_chars``."""
        if max_new_tokens > self.max_new_tokens:
            raise DeployRefusal(f"At most {self.max_new_tokens} new tokens per prompt here.")
        if self.max_prompts is not None and len(prompts) > self.max_prompts:
            raise DeployRefusal(f"{len(prompts):,} prompts; the {self.name} deployment takes at most "
                                f"{self.max_prompts} at once. Lower the prompts to {self.max_prompts}.")
        longest = max((len(p) for p in prompts), default=0)
        if self.max_prompt_chars is not None and longest > self.max_prompt_chars:
            raise DeployRefusal(f"A prompt has {longest:,} characters; the {self.name} deployment takes at most "
                                f"{self.max_prompt_chars:,} per prompt. Shorten it.")

    def check_probe(self, text: str, max_tokens: int) -> None:
        """Refuse a token view or lens over more than ``max_probe_tokens`` tokens, or a text too long to be
        that many (``PROBE_CHARS_PER_TOKEN`` characters a token at most) before it is even tokenized."""
        cap = self.max_probe_tokens
        if cap is None:
            return
        if max_tokens > cap:
            raise DeployRefusal(f"{max_tokens:,} tokens; the {self.name} deployment reads at most {cap:,} "
                                "tokens of a text here.")
        if len(text) > cap * PROBE_CHARS_PER_TOKEN:
            raise DeployRefusal(f"The text has {len(text):,} characters; the {self.name} deployment takes at most "
                                f"{cap * PROBE_CHARS_PER_TOKEN:,} here. Shorten it.")

    def check_criteria(self, metrics) -> None:
        """Refuse the costly influence criteria (a forward pass per layer, or a backward pass) where barred."""
        if self.allow_costly_criteria:
            return
        costly = [m for m in metrics if criterion_cost(m) in COSTLY_COSTS]
        if costly:
            from ghosted.selection.criteria import CRITERIA, SINGLE_PASS

            named = ", ".join(f"{m} ({CRITERIA[_criterion_key(m)].origin})" for m in costly)
            raise DeployRefusal(f"The {self.name} deployment does not compute {named}: each needs a forward "
                                "pass per layer or a backward pass, too slow for a shared server. Choose "
                                f"single-pass criteria: {', '.join(SINGLE_PASS)}.")

    def allowed_models(self) -> tuple[str, ...]:
        """The allow-list, or just the bundled model as the suggestion when anything goes."""
        return self.models if self.models is not None else (BUNDLED_MODEL,)


PROBE_CHARS_PER_TOKEN = 8  # characters a read token may span, at most, in a capped deployment
COSTLY_COSTS = ("per-layer", "gradient")  # criterion costs barred by ``allow_costly_criteria=False``


def _criterion_key(name: str) -> str:
    """The criterion a name stands for: CRITERIA key, or an alias where ``ALIASES`` exists."""
    from ghosted.selection import criteria as layer_influence

    key = str(name).strip().lower()
    return getattr(layer_influence, "ALIASES", {}).get(key, key)


def criterion_cost(name: str) -> str | None:
    """A criterion's cost ("pass", "heldout", "per-layer", "gradient"), None for an unknown name."""
    from ghosted.selection.criteria import CRITERIA

    criterion = CRITERIA.get(_criterion_key(name))
    return criterion.cost if criterion else None


LOCAL = DeployConfig()  # a workstation: everything allowed, nothing capped
DEMO = DeployConfig(  # a public CPU demo (e.g. a 2-vCPU Space): small, safe, no downloads
    name="demo", models=(BUNDLED_MODEL,), allow_local_paths=False, allow_hub_datasets=False,
    allow_trust_remote_code=False, allow_model_download=False, max_calib_tokens=8192,
    max_eval_tokens=8192, max_upload_mb=5, max_new_tokens=64, max_probe_tokens=256, allow_costly_criteria=False,
    max_prompts=8, max_prompt_chars=2000, max_job_gb=4.0, max_job_tflop=20.0, max_visitor_jobs=3, max_visitor_gb=6.0,
    model_dtype="auto", model_device="auto",
    stats_cache_gb=2.0, shared_results=48, idle_release_s=20 * 60)
CLASSROOM = DeployConfig(  # a shared teaching server: small hub models, room for real runs
    name="classroom", models=(BUNDLED_MODEL, "HuggingFaceTB/SmolLM2-135M-Instruct",
                              "HuggingFaceTB/SmolLM2-360M-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"),
    allow_local_paths=False, allow_hub_datasets=True, allow_trust_remote_code=False,
    allow_model_download=False, max_calib_tokens=32768, max_eval_tokens=32768, max_upload_mb=20,
    max_new_tokens=128, max_probe_tokens=512, max_prompts=16, max_prompt_chars=4000, max_job_gb=8.0,
    max_job_tflop=80.0, max_visitor_jobs=4, max_visitor_gb=12.0, model_dtype="auto", model_device="auto",
    stats_cache_gb=10.0, shared_results=96, idle_release_s=45 * 60)
PRESETS = {"local": LOCAL, "demo": DEMO, "classroom": CLASSROOM}


def preset(name: str, **overrides) -> DeployConfig:
    """A preset by name, optionally with some fields changed."""
    if name not in PRESETS:
        raise ValueError(f"Unknown deployment {name!r}; choose from {', '.join(PRESETS)}.")
    return replace(PRESETS[name], **overrides)


def from_env(environ: dict | None = None) -> DeployConfig:
    """The deployment named by ``GHOSTED_DEPLOY``, or ``demo`` when ``GHOSTED_DEMO`` is truthy."""
    env = os.environ if environ is None else environ
    if env.get("GHOSTED_DEMO", "").strip().lower() in ("1", "true", "yes", "on"):
        return DEMO
    return preset(env.get("GHOSTED_DEPLOY", "local").strip().lower() or "local")
