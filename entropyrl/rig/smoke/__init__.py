"""The CPU smoke of the verl recipes: its settings and allow-listed differences (`settings`),
its assets (`assets`), its run (`run`) and its check (`check`); `entropyrl smoke` drives them."""
