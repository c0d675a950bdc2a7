"""Built-in prompt text for tests (public-domain Shakespeare), so tests need no data files."""

TEXT = """First Citizen:
Before we proceed any further, hear me speak.

All:
Speak, speak.

First Citizen:
You are all resolved rather to die than to famish?

ROMEO:
But, soft! what light through yonder window breaks?
It is the east, and Juliet is the sun.
Arise, fair sun, and kill the envious moon,
Who is already sick and pale with grief,
That thou her maid art far more fair than she.

HAMLET:
To be, or not to be, that is the question:
Whether 'tis nobler in the mind to suffer
The slings and arrows of outrageous fortune,
Or to take arms against a sea of troubles
And by opposing end them. To die: to sleep;
No more; and by a sleep to say we end
The heart-ache and the thousand natural shocks
That flesh is heir to, 'tis a consummation
Devoutly to be wish'd.

KING RICHARD III:
Now is the winter of our discontent
Made glorious summer by this sun of York;
And all the clouds that lour'd upon our house
In the deep bosom of the ocean buried.

PORTIA:
The quality of mercy is not strain'd,
It droppeth as the gentle rain from heaven
Upon the place beneath: it is twice blest;
It blesseth him that gives and him that takes.
"""

# Prompt lengths in tokens: 1 token up to more than 1,000, around block boundaries (block_size 16).
PROMPT_LENGTHS = [1, 2, 5, 15, 16, 17, 31, 32, 33, 48, 64, 100, 128, 129, 200, 257, 400, 513, 800, 1100]


def make_prompts(token_ids: list[int], lengths=PROMPT_LENGTHS) -> list[list[int]]:
    """Prompts of the given lengths cut from a long token stream at different offsets."""
    out = []
    n = len(token_ids)
    for i, length in enumerate(lengths):
        start = (i * 37) % max(1, n - length)
        ids = (token_ids * (length // n + 2))[start:start + length]
        out.append(ids)
    return out
