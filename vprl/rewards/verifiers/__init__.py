"""ExoViP's verifiers as a label-free reward ([E] §3.2; docs/references.md#exovip-verifiers): image-text
matching, caption
similarity and VQA P(yes) - P(no), each contrasted with a semantic opposite of the answer, averaged,
and registered as the `verifier` reward (`reward.py`)."""
