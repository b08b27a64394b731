"""``prfaas tokenizer export``: clients loading the folder with ``AutoTokenizer`` get the gateway's
ids (encode, decode and chat rendering), for the emulated byte tokenizer and for a model folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from prfaas.cli import main
from prfaas.config import load_deployment
from prfaas.serve.api import ByteTokenizer
from prfaas.serve.api.tokenizer import render_chat
from prfaas.serve.run import gateway_tokenizer_and_model

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.timeout(120)

EXAMPLE = Path(__file__).parents[3] / "examples" / "two-site.yaml"
TEXTS = [
    "Hello, world!",
    "".join(chr(c) for c in range(128)),  # every ASCII character, controls included
    "héllo wörld, ça va? naïve café",
    "日本語のテキスト and 中文",
    "emoji 😀👍🏽 and a flag 🇫🇷",
    "  leading, trailing and  double  spaces \n\n\t\r\n",
    "<eos> is text to the gateway, not EOS",
    "\u00a0\u2028\u200b\ufeff odd spaces",
]
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "héllo 😀"},
    {"role": "assistant", "content": "hi"},
    {"role": "user", "content": "and now?"},
]


def export(deployment: Path, out: Path) -> Any:
    assert main(["tokenizer", "export", str(deployment), "-o", str(out)]) == 0
    return transformers.AutoTokenizer.from_pretrained(out)


@pytest.fixture(scope="module")
def byte_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    out = tmp_path_factory.mktemp("byte-tokenizer")
    return export(EXAMPLE, out), out


@pytest.mark.parametrize("text", TEXTS)
def test_byte_tokenizer_ids_equal_the_gateways(byte_folder: tuple[Any, Path], text: str) -> None:
    tok, _ = byte_folder
    ids = ByteTokenizer().encode(text)
    assert tok.encode(text) == ids
    assert tok(text)["input_ids"] == ids  # the __call__ form aiperf and guidellm use
    assert tok.decode(ids) == text == ByteTokenizer().decode(ids)


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=40))
def test_byte_tokenizer_ids_equal_on_any_text(byte_folder: tuple[Any, Path], text: str) -> None:
    assert byte_folder[0].encode(text) == ByteTokenizer().encode(text)


def test_byte_tokenizer_specials_length_and_chat(byte_folder: tuple[Any, Path]) -> None:
    tok, out = byte_folder
    assert len(tok) == ByteTokenizer.vocab_size and tok.eos_token_id == ByteTokenizer.eos_token_id
    _, info = gateway_tokenizer_and_model(load_deployment(EXAMPLE))
    assert tok.model_max_length == info.max_context_tokens
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"  # loads in transformers 4 too
    gateway = render_chat(ByteTokenizer(), MESSAGES)
    client = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert tok.encode(client) == gateway
    bare = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=False)
    assert tok.encode(bare) == render_chat(ByteTokenizer(), MESSAGES, add_generation_prompt=False)


def _model_folder(root: Path) -> Path:
    """A model folder with a small byte-level BPE tokenizer (trained here, in a blink)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TEXTS * 20, trainer)
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    model = root / "model"
    hf.save_pretrained(model)
    config = {"model_type": "qwen3", "max_position_embeddings": 2048}
    (model / "config.json").write_text(json.dumps(config))
    return model


def _torch_deployment(root: Path, model_path: Path) -> Path:
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["engine"] = {"kind": "torch", "model": "tiny", "model_path": str(model_path)}
    path = root / "torch.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_model_folder_tokenizer_is_copied(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deployment = _torch_deployment(tmp_path, _model_folder(tmp_path))
    tok = export(deployment, tmp_path / "out")
    assert "gives the gateway's ids" in capsys.readouterr().out
    gateway_tok, _ = gateway_tokenizer_and_model(load_deployment(deployment))
    for text in TEXTS:
        assert tok.encode(text) == gateway_tok.encode(text)


def test_bad_arguments_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deployment = _torch_deployment(tmp_path, tmp_path / "no-such-model")
    assert main(["tokenizer", "export", str(deployment), "-o", str(tmp_path / "o")]) == 2
    assert "engine.model_path" in capsys.readouterr().err
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert main(["tokenizer", "export", str(EXAMPLE), "-o", str(a_file)]) == 2
    assert "not a folder" in capsys.readouterr().err
    assert main(["tokenizer", "export", str(tmp_path / "none.yaml"), "-o", str(tmp_path)]) == 2
    assert "does not exist" in capsys.readouterr().err
