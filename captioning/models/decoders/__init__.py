"""The decoder family: `base.py` (DecoderOutput, the state init from the mean annotation), `unroll.py` (the one engine
that runs a recurrence plainly or packed), `recurrent.py` (the LSTM decoders' base), one file per decoder (`sat.py`,
`luong.py`, `updown.py`, `transformer.py` with `transformer_layers.py`)."""
