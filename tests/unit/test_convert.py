"""Reference checkpoint files (as the reference packages lay them out) load, convert, and fail clearly.

The files here are written from streamdec's own tiny codecs under the reference key names, weight norm
and shapes, so these tests need no reference package (test_ref_parity.py uses the real ones).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import Tensor

from streamdec.cli import main
from streamdec.codecs import Codec, load_codec
from streamdec.codecs.layers import AliasFreeActivation, kaiser_sinc_filter
from streamdec.errors import CheckpointError, CodecError, DTypeError, ShapeError

torch.set_num_threads(2)


def _weight_norm(tensors: dict[str, Tensor], seed: int = 0) -> dict[str, Tensor]:
    """Every ``X.weight`` of rank 3 as ``X.weight_g``/``X.weight_v`` (v rescaled per row, as training leaves it)."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, Tensor] = {}
    for key, w in tensors.items():
        if key.endswith(".weight") and w.dim() == 3:
            prefix = key[: -len("weight")]
            out[prefix + "weight_v"] = w * (torch.rand(w.shape[0], 1, 1, generator=gen) + 0.5)
            out[prefix + "weight_g"] = w.flatten(1).norm(dim=1).view(-1, 1, 1)
        else:
            out[key] = w
    return out


def _ours(codec: Codec) -> dict[str, Tensor]:
    return {k: v for k, v in codec.state_dict().items() if not k.startswith("global_")}


def write_dac(codec: Codec, path: Path, **drop_or_add: Tensor | None) -> Path:
    """A descript-audio-codec ``.pth``: decoder (and other) tensors under their prefixes, plus metadata."""
    state = {f"decoder.{k}": v.view(1, -1, 1) if k.endswith(".alpha") else v for k, v in _ours(codec).items()}
    state = _weight_norm(state)
    state["encoder.block.0.weight_v"] = torch.zeros(4, 1, 7)
    state["quantizer.quantizers.0.codebook.weight"] = torch.zeros(16, 8)
    for key, value in drop_or_add.items():
        state.pop(key, None) if value is None else state.__setitem__(key, value)
    kwargs = {"decoder_dim": codec.config.decoder_dim, "decoder_rates": list(codec.config.decoder_rates),  # type: ignore[attr-defined]
              "sample_rate": codec.sample_rate, "latent_dim": None, "encoder_dim": 64}  # fmt: skip
    torch.save({"state_dict": state, "metadata": {"kwargs": kwargs}}, path)
    return path


def write_bigvgan(codec: Codec, folder: Path) -> Path:
    """``bigvgan_generator.pt`` ({"generator": ...}, filter buffers included) and ``config.json``."""
    folder.mkdir(exist_ok=True)
    state = _weight_norm(_ours(codec))
    taps = kaiser_sinc_filter().float().view(1, 1, 12)
    for name, module in codec.named_modules():
        if isinstance(module, AliasFreeActivation):  # BigVGAN keeps both filters as buffers
            state[f"{name}.upsample.filter"] = taps
            state[f"{name}.downsample.lowpass.filter"] = taps
    torch.save({"generator": state}, folder / "bigvgan_generator.pt")
    config = {**codec.config_dict(), "num_gpus": 0, "batch_size": 32, "use_cuda_kernel": False}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def write_sao(codec: Codec, folder: Path) -> Path:
    """A Stable Audio Open ``model.safetensors`` without model_config.json: the reader infers the shapes."""
    folder.mkdir(exist_ok=True)
    state = {f"pretransform.model.decoder.{k}": v for k, v in _weight_norm(_ours(codec)).items()}
    state["model.model.some.transformer.weight"] = torch.zeros(3)
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    return folder / "model.safetensors"


def _same_audio(a: Codec, b: Codec) -> None:
    z = torch.randn(1, 4, a.latent_dim, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        got, want = b.synthesize(z.transpose(1, 2)), a.synthesize(z.transpose(1, 2))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def dac() -> Codec:
    return load_codec("dac-tiny")


@pytest.fixture(scope="module")
def bigvgan() -> Codec:
    return load_codec("bigvgan-tiny")


@pytest.fixture(scope="module")
def oobleck() -> Codec:
    return load_codec("oobleck-tiny")


def test_dac_pth_converts_and_round_trips(
    dac: Codec, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """streamdec convert weights.pth out.safetensors writes a file that decodes like the source."""
    src = write_dac(dac, tmp_path / "weights.pth")
    assert main(["convert", str(src), str(tmp_path / "out.safetensors")]) == 0
    assert "dac 'weights'" in capsys.readouterr().out
    converted = load_codec(tmp_path / "out.safetensors")
    assert (converted.family, converted.name, converted.sample_rate) == ("dac", "weights", 44100)
    _same_audio(dac, converted)
    _same_audio(dac, load_codec(src))  # load_codec reads the .pth directly too


def test_bigvgan_directory_and_file_load(bigvgan: Codec, tmp_path: Path) -> None:
    """A BigVGAN directory, or its generator file with config.json beside it, loads like the source."""
    folder = write_bigvgan(bigvgan, tmp_path / "bigvgan_v2_tiny")
    from_dir = load_codec(folder)
    assert from_dir.name == "bigvgan_v2_tiny" and from_dir.config_dict() == bigvgan.config_dict()
    _same_audio(bigvgan, from_dir)
    _same_audio(bigvgan, load_codec(folder / "bigvgan_generator.pt"))


def test_stable_audio_shapes_are_inferred_without_model_config(oobleck: Codec, tmp_path: Path) -> None:
    """Without model_config.json the Oobleck architecture is read off the tensor shapes."""
    codec = load_codec(write_sao(oobleck, tmp_path / "sao"))
    assert codec.config_dict() == {**oobleck.config_dict(), "final_tanh": False}
    _same_audio(oobleck, codec)


def test_info_accepts_a_reference_checkpoint(
    dac: Codec, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """streamdec info --codec weights.pth prints the family's exact context."""
    src = write_dac(dac, tmp_path / "weights.pth")
    assert main(["info", "--codec", str(src)]) == 0
    assert "left=10 right=10" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        ({"decoder.model.0.bias": None}, r"missing keys \[model\.0\.bias\]"),
        ({"decoder.model.9.weight": torch.zeros(1)}, r"unexpected keys \[model\.9\.weight\]"),
        (
            {"decoder.model.1.block.0.alpha": torch.ones(1, 5, 1)},
            r"shape mismatches \[model\.1\.block\.0\.alpha: file \(5,\) vs model \(32,\)\]",
        ),
        ({"decoder.model.0.weight_v": None}, r"model\.0\.weight_g but not its partner model\.0\.weight_v"),
    ],
    ids=["missing", "unexpected", "shape", "lone-weight-g"],
)
def test_bad_dac_file_names_the_problem(
    dac: Codec, tmp_path: Path, change: dict[str, Tensor | None], pattern: str
) -> None:
    """A DAC file with a missing, extra or mis-shaped tensor raises CheckpointError naming it."""
    with pytest.raises(CheckpointError, match=pattern):
        load_codec(write_dac(dac, tmp_path / "weights.pth", **change))


def test_dac_metadata_disagreeing_with_tensors_is_refused(dac: Codec, tmp_path: Path) -> None:
    """Metadata whose decoder_rates contradict the tensors is an inconsistent file."""
    path = write_dac(dac, tmp_path / "weights.pth")
    data = torch.load(path, weights_only=True)
    data["metadata"]["kwargs"]["decoder_rates"] = [8, 5, 4, 2]
    torch.save(data, path)
    with pytest.raises(
        CheckpointError, match=r"decoder_rates=\[8, 5, 4, 2\] but the tensors say \[8, 8, 4, 2\]"
    ):
        load_codec(path)


def test_bigvgan_with_a_foreign_filter_is_refused(bigvgan: Codec, tmp_path: Path) -> None:
    """A generator whose alias-free filter differs from the Kaiser-sinc one is not silently accepted."""
    folder = write_bigvgan(bigvgan, tmp_path / "g")
    data = torch.load(folder / "bigvgan_generator.pt", weights_only=True)
    data["generator"]["activation_post.upsample.filter"] = torch.full((1, 1, 12), 1 / 12)
    torch.save(data, folder / "bigvgan_generator.pt")
    with pytest.raises(
        CheckpointError, match=r"activation_post\.upsample\.filter is not the 12-tap Kaiser-sinc"
    ):
        load_codec(folder)


def test_bigvgan_without_config_says_what_is_missing(bigvgan: Codec, tmp_path: Path) -> None:
    """bigvgan_generator.pt alone: the error names the config.json it needs."""
    folder = write_bigvgan(bigvgan, tmp_path / "g")
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"needs config\.json"):
        load_codec(folder / "bigvgan_generator.pt")


def test_unknown_pth_content_is_described(tmp_path: Path) -> None:
    """A .pth that is neither DAC nor BigVGAN lists what it found."""
    torch.save({"model": {}, "optimizer": {}}, tmp_path / "other.pth")
    with pytest.raises(CheckpointError, match=r"neither a DAC checkpoint.*\['model', 'optimizer'\]"):
        load_codec(tmp_path / "other.pth")


def test_pickled_code_is_never_run(tmp_path: Path) -> None:
    """Files are read weights-only: a pickled object is refused, not executed."""
    torch.save({"state_dict": {}, "metadata": {"kwargs": {"x": Path("/")}}}, tmp_path / "evil.pth")
    with pytest.raises(CheckpointError, match="weights-only"):
        load_codec(tmp_path / "evil.pth")


def test_convert_refuses_to_overwrite_and_wrong_suffix(
    dac: Codec, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An existing destination needs --force; a destination not ending in .safetensors is refused."""
    src = write_dac(dac, tmp_path / "weights.pth")
    dst = tmp_path / "out.safetensors"
    dst.write_bytes(b"")
    assert main(["convert", str(src), str(dst)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["convert", str(src), str(dst), "--force", "--name", "mine"]) == 0
    assert load_codec(dst).name == "mine"
    with pytest.raises(CodecError, match=r"must end in \.safetensors"):
        from streamdec.codecs.convert import convert

        convert(src, tmp_path / "out.pt")


def test_dac_codebooks_reject_bad_codes(tmp_path: Path) -> None:
    """Float codes, too many codebooks and out-of-range codes are refused with the fix."""
    from streamdec.codecs.formats import read_dac_codebooks

    gen = torch.Generator().manual_seed(0)
    state = {}
    for i in range(2):
        state[f"quantizer.quantizers.{i}.codebook.weight"] = torch.randn(16, 4, generator=gen)
        state[f"quantizer.quantizers.{i}.out_proj.weight_v"] = torch.randn(6, 4, 1, generator=gen)
        state[f"quantizer.quantizers.{i}.out_proj.weight_g"] = torch.rand(6, 1, 1, generator=gen) + 0.5
        state[f"quantizer.quantizers.{i}.out_proj.bias"] = torch.randn(6, generator=gen)
    torch.save({"state_dict": state, "metadata": {"kwargs": {}}}, tmp_path / "w.pth")
    books = read_dac_codebooks(tmp_path / "w.pth")
    assert (books.n_codebooks, books.codebook_size) == (2, 16)
    codes = torch.tensor([[3, 5], [0, 15]])
    w = torch._weight_norm(
        state["quantizer.quantizers.1.out_proj.weight_v"],
        state["quantizer.quantizers.1.out_proj.weight_g"],
        0,
    )
    one = (
        state["quantizer.quantizers.1.codebook.weight"][codes[:, 1]] @ w[..., 0].T
        + state["quantizer.quantizers.1.out_proj.bias"]
    )
    both = books.latents(codes)
    torch.testing.assert_close(both - books.latents(codes[:, :1]), one, atol=1e-5, rtol=0)
    with pytest.raises(DTypeError, match="integer codes"):
        books.latents(codes.float())
    with pytest.raises(ShapeError, match=r"1 <= n <= 2"):
        books.latents(torch.zeros(4, 3, dtype=torch.long))
    with pytest.raises(ShapeError, match=r"\[0, 16\)"):
        books.latents(torch.full((4, 2), 16))


def _autoencoder_folder(oobleck: Codec, folder: Path, decoder_config: dict[str, object]) -> Path:
    """A stable-audio-tools autoencoder: keys under ``decoder.``, model_config.json of model_type autoencoder."""
    folder.mkdir(exist_ok=True)
    state = {f"decoder.{k}": v for k, v in _weight_norm(_ours(oobleck)).items()}
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    config = {"model_type": "autoencoder", "sample_rate": 44100,
              "model": {"encoder": {"type": "oobleck", "config": {}}, "decoder": {"type": "oobleck", "config": decoder_config}}}  # fmt: skip
    (folder / "model_config.json").write_text(json.dumps(config))
    return folder / "model.safetensors"


def test_autoencoder_config_defaults_follow_the_reference(oobleck: Codec, tmp_path: Path) -> None:
    """An autoencoder model_config.json without final_tanh means OobleckDecoder's default, tanh on."""
    cfg = oobleck.config_dict()
    decoder = {k: cfg[k] for k in ("latent_dim", "channels", "c_mults", "strides", "out_channels")} | {
        "use_snake": True
    }
    codec = load_codec(_autoencoder_folder(oobleck, tmp_path / "ae", decoder))
    assert codec.config_dict()["final_tanh"] is True
    z = torch.randn(1, 3, oobleck.latent_dim, generator=torch.Generator().manual_seed(4)).transpose(1, 2)
    with torch.inference_mode():
        torch.testing.assert_close(codec.synthesize(z), torch.tanh(oobleck.synthesize(z)), atol=1e-5, rtol=0)


def test_oobleck_without_snake_is_refused_by_name(oobleck: Codec, tmp_path: Path) -> None:
    """An ELU Oobleck (use_snake false) is not silently decoded with Snakes."""
    with pytest.raises(CheckpointError, match=r"use_snake=False"):
        load_codec(_autoencoder_folder(oobleck, tmp_path / "ae", {"latent_dim": 8}))
