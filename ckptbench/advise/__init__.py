"""Advise: a user's question as flags (model, card, batch sizes, sequence lengths, precision, optimizer) answered
without a GPU: which layouts fit the card (exact memory predictions, the smallest k found by bisection), what
each costs in time (the step-time model, fitted or transferred), what fills the memory, and the code that
applies the chosen layout. Data only: render/advise.py shows it."""
