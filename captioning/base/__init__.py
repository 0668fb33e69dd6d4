"""The ground floor: declarations every other package may import, importing none of them.

    constraints.py  `Annotated[int, Range(ge=1)]`: a constraint written once, in the signature; `@constrained`
    signature.py    binding a group's keys to a signature without calling it (the config checker and the registry)
    tokens.py       the special tokens and their ids (the vocabulary and decoding)
    decoding.py     the decoding defaults (beam size, most words) of the API and the commands
    moved.py        config keys that moved, mapped once (old command lines and checkpoints still work)
    files.py        the one file writer: atomic (temporary file, fsync, rename); a failed write loses nothing and
                    raises one line naming the file
    jsonio.py       JSON read and written through it (standard library only: scoring never imports torch)
    lock.py         one writer per output folder
    messages.py     an error message on one line, control characters escaped
    transforms.py   an image transform's steps (nested Compose flattened): the one walk over them
"""
