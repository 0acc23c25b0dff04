"""aspen.inferenceModel and aspen.trainingModel on a built-in family's Hugging Face directory: logits,
hidden states and the loss equal the goldens transformers made (models/testdata)."""

import numpy as np
import pytest

import aspen
from conftest import TESTDATA, assert_close, read_safetensors


@pytest.mark.parametrize("family", ["gpt2-tiny", "gptj-tiny", "llama-tiny", "mistral-tiny", "qwen2-tiny"])
def test_causal_lm_logits(family):
    g = read_safetensors(TESTDATA / family / "golden.safetensors")
    model = aspen.inferenceModel(TESTDATA / family)
    logits = model(g["input_ids"])
    assert_close(logits, g["logits"], atol=2e-4, what=f"{family} logits")
    # deviceIterations: the two rows as two steps of one row each
    two = aspen.inferenceModel(TESTDATA / family, aspen.Options().deviceIterations(2))
    assert_close(two(g["input_ids"]), g["logits"], atol=2e-4, what=f"{family} logits, 2 iterations")


def test_bert_outputs():
    g = read_safetensors(TESTDATA / "bert-tiny" / "golden.safetensors")
    model = aspen.inferenceModel(TESTDATA / "bert-tiny")
    hidden, pooled = model(g["input_ids"], attention_mask=g["attention_mask"], token_type_ids=g["token_type_ids"])
    mask = g["attention_mask"][..., None].astype(bool)
    assert_close(np.where(mask, hidden, 0), np.where(mask, g["last_hidden_state"], 0), atol=2e-4, what="hidden")
    assert_close(pooled, g["pooler_output"], atol=2e-4, what="pooler")


@pytest.mark.parametrize("family,table", [("gpt2-tiny", "transformer.wte.weight"),
                                          ("llama-tiny", "model.embed_tokens.weight")])
def test_training_loss_is_hugging_faces(family, table):
    g = read_safetensors(TESTDATA / family / "golden.safetensors")
    ids = g["input_ids"]
    targets = np.concatenate([ids[:, 1:], np.full((ids.shape[0], 1), -100)], axis=1)  # HF shifts; aspen doesn't
    training = aspen.trainingModel(TESTDATA / family, optimizer=aspen.optim.SGD(None, lr=0.01))
    first = float(training(ids, targets))
    assert first == pytest.approx(float(g["loss"][0]), rel=1e-4)
    later = [float(training(ids, targets)) for _ in range(5)]
    assert later[-1] < first
    w = training.weights()
    assert table in w and w[table].shape == (1000, 48)


def test_hf_directory_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        aspen.inferenceModel(tmp_path)
    with pytest.raises(ValueError, match="trains here"):
        aspen.trainingModel(TESTDATA / "bert-tiny")
    model = aspen.inferenceModel(TESTDATA / "gpt2-tiny")
    with pytest.raises(ValueError, match="positions"):
        model(np.zeros((1, 65), np.int64))
    with pytest.raises(ValueError, match=r"^input 'input_ids': expected ids in \[0, 1000\) \(config.json vocab_size\), "
                                         r"found input_ids\[0, 0\] = 5000$"):
        model(np.full((1, 65 - 1), 5000))
    with pytest.raises(ValueError, match="int32 range"):
        model(np.full((1, 64), 2 ** 33))
    with pytest.raises(ValueError, match="integer ids"):
        model(np.zeros((1, 64), np.float32))
    with pytest.raises(ValueError, match=r"\[batch, sequence\]"):
        aspen.inferenceModel(TESTDATA / "gpt2-tiny")(np.zeros(5, np.int64))


def test_out_of_range_values_are_named_never_wrapped():
    """uint32 ids of 2^31 and more, bool ids, an attention mask of 256 and negative ids in decode were once
    wrapped or dropped without a word: each is now a ValueError naming the argument."""
    model = aspen.inferenceModel(TESTDATA / "gpt2-tiny")
    with pytest.raises(ValueError, match=r"input 'input_ids': expected ids in the int32 range, found 0 .. 2147483648"):
        model(np.array([[0, 2 ** 31]], np.uint32))
    with pytest.raises(ValueError, match="input 'input_ids': expected integer ids, found bool"):
        model(np.ones((1, 4), bool))
    g = read_safetensors(TESTDATA / "bert-tiny" / "golden.safetensors")
    bert = aspen.inferenceModel(TESTDATA / "bert-tiny")
    mask = np.array(g["attention_mask"], np.int64)
    mask[0, 0] = 256
    with pytest.raises(ValueError, match=r"input 'attention_mask': expected a mask of 0 and 1, found values 0 .. 256"):
        bert(g["input_ids"], attention_mask=mask, token_type_ids=g["token_type_ids"])
    tok = aspen.Tokenizer.from_file(TESTDATA / "gpt2-tiny")
    with pytest.raises(ValueError, match=r"ids\[1\]: expected a token id in \[0, 1000\), found -5"):
        tok.decode([3, -5], False)


def test_ids_are_checked_against_the_config_by_name():
    """Ids past an embedding table once surfaced from inside the graph ("node 5 (gather): ... argument 'ids'"),
    and targets of another shape were compared flattened (or taken, when flat): each input is now checked
    against config.json and input_ids, by its name."""
    g = read_safetensors(TESTDATA / "bert-tiny" / "golden.safetensors")
    bert = aspen.inferenceModel(TESTDATA / "bert-tiny")
    types = np.array(g["token_type_ids"], np.int64)
    types[0, 2] = 7
    with pytest.raises(ValueError, match=r"^input 'token_type_ids': expected ids in \[0, 2\) \(config.json "
                                         r"type_vocab_size\), found token_type_ids\[0, 2\] = 7$"):
        bert(g["input_ids"], attention_mask=g["attention_mask"], token_type_ids=types)
    ids = np.array([[1, 2, 3, 4]])
    with pytest.raises(ValueError, match=r"^input 'input_ids': expected ids in \[0, 1000\) \(config.json vocab_size\), "
                                         r"found input_ids\[0, 2\] = 99999$"):
        aspen.inferenceModel(TESTDATA / "gpt2-tiny")(np.array([[1, 2, 99999, 4]]))
    training = aspen.trainingModel(TESTDATA / "gpt2-tiny")
    with pytest.raises(ValueError, match=r"^input 'targets': expected shape \(1, 4\) \(that of input_ids: the next "
                                         r"token of each position\), found shape \(1, 3\)$"):
        training(ids, np.array([[2, 3, 4]]))
    with pytest.raises(ValueError, match=r"^input 'targets': expected shape \(1, 4\) .*, found shape \(4,\)$"):
        training(ids, np.array([2, 3, 4, 5]))
    with pytest.raises(ValueError, match=r"^input 'targets': expected ids in \[0, 1000\) \(config.json vocab_size\) "
                                         r"or -100 \(ignored\), found targets\[0, 3\] = 1000$"):
        training(ids, np.array([[2, 3, -100, 1000]]))
    assert np.isfinite(float(training(ids, np.array([[2, 3, 4, -100]]))))
    with pytest.raises(ValueError, match=r"^optimizer params: expected None for a Hugging Face directory \(every "
                                         r"weight trains\), found \['transformer.wte.weight'\]$"):
        aspen.trainingModel(TESTDATA / "gpt2-tiny", optimizer=aspen.optim.SGD(["transformer.wte.weight"], lr=0.1))
