"""The ReST loop (ViUniT/ViReP): sample, score, keep the rewarded programs (`select`), fine-tune the
LoRA on them (`sft`), repeat (`loop`); one folder per iteration (`iterations`); from the recipe (`run`)."""
