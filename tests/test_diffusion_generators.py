"""The diffusers image generators end to end on CPU: tiny SD / SDXL / GLIGEN pipelines built here.

Every model is random and tiny (32 px, 2 steps): the images mean nothing, but the whole path is the
real one (tokenizer, text encoder, UNet, scheduler, VAE, safety checker, GLIGEN's gated layers).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import tiny_models as tiny

from vprl.executor.tools.hf.sampling import SamplingSettings
from vprl.rewards.unit_tests.diffusion import (
    DiffusersLayoutToImage,
    DiffusersTextToImage,
    DiffusionConfig,
    LayoutError,
    UnsafeImageError,
)
from vprl.rewards.unit_tests.llm_layout import Layout, LayoutBox, parse_layout
from vprl.rewards.unit_tests.protocols import build_generator, generator_names

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

SIZE = dict(height=32, width=32, steps=2, device="cpu")
TWO_OBJECTS = Layout((LayoutBox("a red car", (0, 256, 256, 256)), LayoutBox("a dog", (300, 40, 200, 200))))


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def pixels(image) -> np.ndarray:
    return np.asarray(image, dtype=np.int16)


class Components:
    """Tiny random parts, built once; pipelines are assembled from them per test (cheap)."""

    def __init__(self, root) -> None:
        from diffusers import AutoencoderKL, DDIMScheduler, UNet2DConditionModel
        from diffusers.models.attention import GatedSelfAttentionDense
        from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

        torch.manual_seed(0)
        # CLIP-style: EOS appended (the text encoder pools on it), padding to 77 like the real tokenizer.
        self.tokenizer = tiny.bpe_tokenizer(root / "tokenizer", add_eos=True, max_length=77)
        tok = self.tokenizer
        text = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                    num_attention_heads=4, max_position_embeddings=77, bos_token_id=tok.bos_token_id,
                    eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)  # fmt: skip
        self.text_encoder = CLIPTextModel(CLIPTextConfig(**text))
        self.text_encoder_2 = CLIPTextModelWithProjection(CLIPTextConfig(**text, projection_dim=32))
        self.vae = AutoencoderKL(block_out_channels=[32, 64], down_block_types=["DownEncoderBlock2D"] * 2,
                                 up_block_types=["UpDecoderBlock2D"] * 2, latent_channels=4, norm_num_groups=8,
                                 sample_size=32)  # fmt: skip
        unet = dict(block_out_channels=(32, 64), layers_per_block=1, sample_size=16, cross_attention_dim=32,
                    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), norm_num_groups=8,
                    up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), attention_head_dim=4)  # fmt: skip
        self.unet = UNet2DConditionModel(**unet)
        self.gligen_unet = UNet2DConditionModel(**unet, attention_type="gated")
        for module in self.gligen_unet.modules():
            if isinstance(module, GatedSelfAttentionDense):
                # GLIGEN's gates start closed (tanh(0) = 0); open them so the boxes shape the image.
                module.alpha_attn.data.fill_(1.0)
                module.alpha_dense.data.fill_(1.0)
        # SDXL: pooled text (32) + 6 size/crop ids x 8 features = 80; two text encoders concatenated = 64.
        self.xl_unet = UNet2DConditionModel(**{**unet, "cross_attention_dim": 64}, addition_embed_type="text_time",
                                            addition_time_embed_dim=8, projection_class_embeddings_input_dim=80)  # fmt: skip
        self.scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                       clip_sample=False, set_alpha_to_one=False, steps_offset=1)  # fmt: skip

    def sd(self, safety_checker=None, feature_extractor=None):
        from diffusers import StableDiffusionPipeline

        return StableDiffusionPipeline(vae=self.vae, text_encoder=self.text_encoder, tokenizer=self.tokenizer,
                                       unet=self.unet, scheduler=self.scheduler, safety_checker=safety_checker,
                                       feature_extractor=feature_extractor, requires_safety_checker=False)  # fmt: skip

    def gligen(self):
        from diffusers import StableDiffusionGLIGENPipeline

        return StableDiffusionGLIGENPipeline(vae=self.vae, text_encoder=self.text_encoder, tokenizer=self.tokenizer,
                                             unet=self.gligen_unet, scheduler=self.scheduler, safety_checker=None,
                                             feature_extractor=None, requires_safety_checker=False)  # fmt: skip

    def sdxl(self):
        from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline

        scheduler = EulerDiscreteScheduler.from_config(self.scheduler.config)
        return StableDiffusionXLPipeline(vae=self.vae, text_encoder=self.text_encoder,
                                         text_encoder_2=self.text_encoder_2, tokenizer=self.tokenizer,
                                         tokenizer_2=self.tokenizer, unet=self.xl_unet, scheduler=scheduler)  # fmt: skip


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> Components:
    return Components(tmp_path_factory.mktemp("tiny_diffusion"))


def feature_extractor():
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    return CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})


class FlagFirst(torch.nn.Module):
    """A safety checker that flags the first `n` images it sees (the pipeline calls it once per image)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n, self.calls = n, 0

    @property
    def device(self):  # the pipeline asks every component for its device
        return torch.device("cpu")

    def forward(self, images, clip_input):
        self.calls += 1
        return images, [self.calls <= self.n] * len(images)


def test_generators_are_registered_and_check_settings():
    build_generator("diffusers_t2i", model="x")  # loads the built-in modules; nothing is loaded yet
    assert {"diffusers_t2i", "diffusers_layout"} <= set(generator_names())
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['step'\].*valid settings"):
        build_generator("diffusers_t2i", model="x", step=2)
    with pytest.raises(ValueError, match="dtype must be one of"):
        build_generator("diffusers_t2i", model="x", dtype="fp16")
    with pytest.raises(ValueError, match="multiple of 8"):
        build_generator("diffusers_t2i", model="x", height=30)
    with pytest.raises(ValueError, match="exactly one of"):
        build_generator("diffusers_layout", model="x")
    a = build_generator("diffusers_t2i", model="x").config_key
    assert a != build_generator("diffusers_t2i", model="x", guidance_scale=7.5).config_key
    assert a == build_generator("diffusers_t2i", model="x", device="cpu").config_key  # device-independent


def test_text_to_image_is_deterministic_by_seed(parts):
    gen = DiffusersTextToImage(DiffusionConfig(model="tiny-sd", **SIZE), pipeline=parts.sd())
    first = gen.generate("a red car next to a dog", seed=0)
    assert first.size == (32, 32) and first.mode == "RGB"
    assert np.array_equal(pixels(first), pixels(gen.generate("a red car next to a dog", seed=0)))
    assert not np.array_equal(pixels(first), pixels(gen.generate("a red car next to a dog", seed=1)))
    assert gen.stats == Counter(images=3)


def test_nsfw_flag_retries_with_the_next_seed(parts):
    checker = FlagFirst(3)
    gen = DiffusersTextToImage(
        DiffusionConfig(model="tiny-sd", **SIZE), pipeline=parts.sd(checker, feature_extractor())
    )
    image = gen.generate("a cat", seed=10)
    assert checker.calls == 4 and gen.last_seed == 13 and gen.stats["nsfw_flagged"] == 3
    unchecked = DiffusersTextToImage(DiffusionConfig(model="tiny-sd", **SIZE), pipeline=parts.sd())
    assert np.array_equal(pixels(image), pixels(unchecked.generate("a cat", seed=13)))


def test_nsfw_gives_up_after_ten_retries(parts):
    checker = FlagFirst(10**6)
    config = DiffusionConfig(model="tiny-sd", **{**SIZE, "steps": 1})  # 11 images: keep each cheap
    gen = DiffusersTextToImage(config, pipeline=parts.sd(checker, feature_extractor()))
    with pytest.raises(UnsafeImageError, match=r"flagged all 11 images for 'a cat' \(seeds 5\.\.15\)"):
        gen.generate("a cat", seed=5)
    assert checker.calls == 11 and gen.stats["images"] == 0


def test_checkpoints_load_by_path_sd_with_real_safety_checker_and_sdxl(parts, tmp_path):
    from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker
    from transformers import CLIPConfig

    checker = StableDiffusionSafetyChecker(CLIPConfig(
        text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=8),
        projection_dim=32,
    ))  # fmt: skip
    checker.concept_embeds_weights.data.fill_(-2.0)  # cosine - (-2) > 0: every image is flagged
    parts.sd(checker, feature_extractor()).save_pretrained(tmp_path / "sd")
    parts.sdxl().save_pretrained(tmp_path / "sdxl")

    flagged = build_generator("diffusers_t2i", model=str(tmp_path / "sd"), nsfw_retries=2, **SIZE)
    with pytest.raises(UnsafeImageError, match="flagged all 3 images"):
        flagged.generate("a dog", seed=0)
    assert type(flagged.pipeline).__name__ == "StableDiffusionPipeline"
    unchecked = build_generator("diffusers_t2i", model=str(tmp_path / "sd"), safety_checker=False, **SIZE)
    assert unchecked.generate("a dog", seed=0).size == (32, 32) and unchecked.pipeline.safety_checker is None

    xl = build_generator("diffusers_t2i", model=str(tmp_path / "sdxl"), **SIZE)
    image = xl.generate("a dog on a red car", seed=0)
    assert type(xl.pipeline).__name__ == "StableDiffusionXLPipeline" and image.size == (32, 32)
    assert np.array_equal(pixels(image), pixels(xl.generate("a dog on a red car", seed=0)))


def test_layout_generator_puts_the_boxes_into_the_image(parts):
    def layout_fn(description: str) -> Layout:
        return TWO_OBJECTS

    def moved_fn(description: str) -> Layout:
        return Layout((LayoutBox("a red car", (256, 0, 256, 256)), LayoutBox("a dog", (0, 300, 200, 200))))

    config = DiffusionConfig(model="tiny-gligen", **SIZE)
    # beta 1: the boxes guide every step (the default 0.3 of 2 steps is none)
    gen = DiffusersLayoutToImage(config, layout_fn=layout_fn, pipeline=parts.gligen(), scheduled_sampling_beta=1.0)
    image = gen.generate("a red car and a dog", seed=0)
    assert image.size == (32, 32)
    assert np.array_equal(pixels(image), pixels(gen.generate("a red car and a dog", seed=0)))
    moved = DiffusersLayoutToImage(config, layout_fn=moved_fn, pipeline=parts.gligen(), scheduled_sampling_beta=1.0)
    assert not np.array_equal(pixels(image), pixels(moved.generate("a red car and a dog", seed=0)))
    assert gen.config_key != moved.config_key  # the layout source keys the image cache
    assert gen.stats == Counter(images=2) and not gen.warnings
    assert TWO_OBJECTS.gligen_boxes() == [[0.0, 0.5, 0.5, 1.0], [300 / 512, 40 / 512, 500 / 512, 240 / 512]]


class ScriptedBackend:
    """Text backend returning fixed replies: the reply -> layout path without a capable LLM."""

    def __init__(self, replies: list[str]) -> None:
        self.replies, self.prompts = replies, []

    def generate(self, prompts, sampling: SamplingSettings):
        self.prompts.extend(prompts)
        return [list(self.replies[: sampling.n]) for _ in prompts]


def test_layout_llm_reply_becomes_gligen_input(parts):
    good = (" [('a red car', [0, 256, 256, 256]), ('a dog', [300, 40, 200, 200])]\n"
            "Background prompt: A realistic street\nNegative prompt: None\n\nCaption: two cats\nObjects: [('a cat', [0, 0, 9, 9])]")  # fmt: skip
    backend = ScriptedBackend(["Objects: none that I can see", good])
    gen = build_generator("diffusers_layout", model="tiny-gligen", pipeline=parts.gligen(), layout_backend=backend,
                          layout={"model": "layout-llm", "num_candidates": 2}, scheduled_sampling_beta=1.0,
                          **SIZE)  # fmt: skip
    (layout,) = gen.plan_layouts(["a red car and a dog"])
    assert layout == Layout(TWO_OBJECTS.boxes, background="A realistic street", negative=None)
    assert backend.prompts[0].rstrip().endswith("Caption: a red car and a dog\nObjects:")
    via_fn = DiffusersLayoutToImage(DiffusionConfig(model="x", **SIZE), layout_fn=lambda d: TWO_OBJECTS,
                                    pipeline=parts.gligen(), scheduled_sampling_beta=1.0)  # fmt: skip
    image = gen.generate("a red car and a dog", seed=3)
    assert np.array_equal(pixels(image), pixels(via_fn.generate("a red car and a dog", seed=3)))
    assert len(backend.prompts) == 1  # generate reused the planned layout
    assert gen.planner.warnings == Counter(no_boxes=1)


def test_random_layout_llm_falls_back_to_text_to_image(parts, tmp_path):
    """Bad input: a tiny random LM writes no boxes; the description is drawn without a layout."""
    lm = tiny.build("causal_lm", tmp_path / "lm")
    parts.gligen().save_pretrained(tmp_path / "gligen")
    layout = {"model": lm, "num_candidates": 2, "max_new_tokens": 8, "device": "cpu"}
    gen = build_generator("diffusers_layout", model=str(tmp_path / "gligen"), layout=layout, **SIZE)
    image = gen.generate("a red car", seed=0)
    assert image.size == (32, 32) and gen.warnings["no_layout"] == 1 and gen.stats["fallbacks"] == 1
    assert gen.planner.warnings == Counter(no_boxes=2, no_layout=1)
    strict = DiffusersLayoutToImage(DiffusionConfig(model="x", **SIZE), layout_fn=lambda d: None,
                                    pipeline=gen.pipeline, on_empty_layout="error")  # fmt: skip
    with pytest.raises(LayoutError, match="no layout for 'a red car'"):
        strict.generate("a red car", seed=0)


def test_parse_layout_clips_drops_and_reads_prompts():
    warnings = Counter()
    reply = ("[(\"a tall tree\", [400, 100, 200, 300]), ('a ghost', [600, 0, 50, 50]), ('a bench', [10, 300, 120, 80])]\n"
             "Background prompt: A park in autumn\nNegative prompt: people")  # fmt: skip
    layout = parse_layout(reply, warnings=warnings)
    assert layout.boxes == (LayoutBox("a tall tree", (400, 100, 112, 300)), LayoutBox("a bench", (10, 300, 120, 80)))
    assert (layout.background, layout.negative) == ("A park in autumn", "people")
    assert warnings == Counter(box_dropped=1)
    assert Layout.from_json(layout.to_json()) == layout
    assert parse_layout("Objects: [] Background prompt: sky", warnings=warnings) is None
    assert warnings["no_boxes"] == 1
    assert parse_layout("[('a cat', [0, 0, 64, 64])]").background == "A realistic scene"
