"""Real text prompts for the model oracles (prose, code, chat markup)."""

SHORT = "The capital of France is Paris, and the capital of Italy is"

CODE = '''def merge_sorted(left: list[int], right: list[int]) -> list[int]:
    """Merge two sorted lists into one sorted list in linear time."""
    result = []
    i = j = 0
    while i < len(left) and j < len(right):
        if left[i] <= right[j]:
            result.append(left[i])
            i += 1
        else:
            result.append(right[j])
            j += 1
    result.extend(left[i:])
    result.extend(right[j:])
    return result


def merge_sort(values: list[int]) -> list[int]:
    if len(values) <= 1:
        return values
    middle = len(values) // 2
    return merge_sorted(merge_sort(values[:middle]), merge_sort(values[middle:]))
'''

PROSE = (
    "<|im_start|>system\nYou are a careful assistant who answers questions about history.<|im_end|>\n"
    "<|im_start|>user\nSummarise the following passage in two sentences.\n\n"
    "The printing press, developed by Johannes Gutenberg around 1440 in Mainz, combined several existing "
    "technologies into a practical system for mass-producing text. Movable metal type, cast from a hand mould "
    "in an alloy of lead, tin and antimony, could be arranged into pages, inked with an oil-based varnish and "
    "pressed onto paper with a screw press adapted from those used to make wine and olive oil. Before this, "
    "books in Europe were copied by hand, usually by scribes working in monasteries, and a single copy of a "
    "large work could take months or years to finish. Within fifty years of Gutenberg's first Bible, printing "
    "shops had spread to more than two hundred cities, and millions of volumes were in circulation. The price "
    "of books fell sharply, literacy began to rise among merchants and artisans, and ideas travelled faster "
    "than ever before. Historians often connect the press to the Reformation, because pamphlets by Martin "
    "Luther and his opponents were printed in enormous numbers and read across the German lands within weeks. "
    "Scientists, too, benefited: astronomers could compare identical tables of observations, and errors in a "
    "printed text could be corrected in a later edition rather than multiplied by every copyist. Not everyone "
    "welcomed the change. Some scholars complained that cheap books spread mistakes and heresies, and rulers "
    "soon introduced licences and censorship to control what could be printed. Still, by the end of the "
    "sixteenth century the printed book had become the ordinary way of storing and sharing knowledge, and "
    "the handwritten manuscript had become a rarity kept for special documents and luxury editions. The "
    "technique itself changed little for three centuries, until steam-powered presses and machine-made paper "
    "in the nineteenth century lowered costs again and made daily newspapers possible for a mass audience.<|im_end|>\n"
    "<|im_start|>assistant\n"
)

PROMPTS = {"short": SHORT, "code": CODE, "prose": PROSE}
