import pytest

from kernel_lsp.agent.patches import ParseError, apply_patches, parse_answer, parse_patches

SRC = """import torch

class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x * 2
"""


def test_whole_file_in_fence():
    ans = "Doubled via add.\n```python\nimport torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x + x\n```\n"
    p = parse_answer(ans, SRC, kind="python")
    assert p.form == "file" and "x + x" in p.source and p.note == "Doubled via add."


def test_patch_applied():
    ans = "Use add.\n<<<<<<< SEARCH\n        return x * 2\n=======\n        return x + x\n>>>>>>> REPLACE\n"
    p = parse_answer(ans, SRC, kind="python")
    assert p.form == "patch" and p.patches == 1
    assert p.source == SRC.replace("x * 2", "x + x")


def test_patch_tolerates_trailing_whitespace():
    ans = "<<<<<<< SEARCH\n        return x * 2   \n=======\n        return x + x\n>>>>>>> REPLACE"
    assert "x + x" in parse_answer(ans, SRC, kind="python").source


def test_two_patches_in_order():
    patches = parse_patches("<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE\n"
                            "<<<<<<< SEARCH\nb\n=======\nc\n>>>>>>> REPLACE\n")
    assert apply_patches("a\n", patches) == "c\n"


@pytest.mark.parametrize("answer, reason", [
    ("", "empty answer"),
    ("   \n", "empty answer"),
    ("I think you should use shared memory.", "prose only"),
    ("<<<<<<< SEARCH\n    return y\n=======\n    return z\n>>>>>>> REPLACE", "not found"),
    ("<<<<<<< SEARCH\nreturn x\n>>>>>>> REPLACE", "malformed"),
    ("```python\nimport torch\n", "unterminated"),
    ("```python\nimport torch\nclass Model: pass\n```", "defines no ModelNew"),
    ("```python\n" + SRC + "```", "identical"),
    ("x" * 200_001, "too long"),
])
def test_bad_answers_are_parse_errors(answer, reason):
    with pytest.raises(ParseError, match=reason):
        parse_answer(answer, SRC, kind="python")


def test_ambiguous_search_rejected():
    with pytest.raises(ParseError, match="2 times"):
        apply_patches("a\na\n", parse_patches("<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE"))


def test_picks_cuda_block_for_cuda_candidate():
    ans = "```bash\nnvcc x.cu\n```\n```cuda\n__global__ void k() {}\nextern \"C\" void f() {}\n```"
    assert parse_answer(ans, "old", kind="cuda").source.startswith("__global__")


def test_too_long_is_relative_to_source():
    big = "a" * 5000
    with pytest.raises(ParseError, match="too long"):
        parse_answer("```cuda\n" + "b" * 60000 + "\n```", big, kind="cuda")


def test_a_patch_that_does_not_apply_says_why_and_carries_the_block():
    import pytest as _pytest

    from kernel_lsp.agent.patches import ParseError, apply_patches, parse_answer, parse_patches

    src = "a = 1\nb = 1\nc = 2\n"
    dup = "<<<<<<< SEARCH\n= 1\n=======\n= 3\n>>>>>>> REPLACE\n"
    with _pytest.raises(ParseError) as e:
        apply_patches(src, parse_patches(dup))
    assert e.value.why == "not unique" and "= 1\n=======\n= 3" in e.value.patch
    with _pytest.raises(ParseError) as e:
        apply_patches(src, parse_patches("<<<<<<< SEARCH\nz = 9\n=======\nz = 1\n>>>>>>> REPLACE\n"))
    assert e.value.why == "not found" and "z = 9" in e.value.patch
    with _pytest.raises(ParseError) as e:
        parse_answer("<<<<<<< SEARCH\na = 1\n>>>>>>> REPLACE\n", src, kind="cuda")
    assert e.value.why == "malformed" and e.value.patch.startswith("<<<<<<< SEARCH")
    # SEARCH lines copied with the prompt's line numbers still apply.
    numbered = "<<<<<<< SEARCH\n  2| b = 1\n=======\nb = 5\n>>>>>>> REPLACE\n"
    assert apply_patches(src, parse_patches(numbered)) == "a = 1\nb = 5\nc = 2\n"
