"""Training data: from a source (files, saved or hub data sets) to checked, tokenised, packed examples."""
