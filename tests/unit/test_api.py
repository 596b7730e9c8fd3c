"""charlm's Python API (charlm/api.py), without a trained run."""

import sys


def test_charlm_generate_stays_the_api_function_after_importing_the_decoding_module():
    import charlm
    import charlm.api
    import charlm.generation.decoding  # noqa: F401  (the decoder's `generate`)

    assert charlm.generate is charlm.api.generate
    assert sys.modules["charlm.generation.decoding"].generate is not charlm.generate
