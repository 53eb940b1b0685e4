"""Campaign-only code beside the stage scripts: a config's GPU time, a GPU config's tiny CPU form."""
