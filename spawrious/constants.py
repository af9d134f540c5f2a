"""The factors of variation of Spawrious (paper section 4.2, phrases from the authors' code).

The prompt template has one slot per factor; [animal] is the label, [location] the
spurious background. Lists keep the paper's order, duplicates included (time of day
lists "bright sunny day" twice, so it has double weight: 4 x 3 x 6 = 72 prompts per
(breed, location)).
"""
from __future__ import annotations

from oodutils.errors import UnknownNameError

# Breeds in the paper's order (generation order); labels use CLASS_LIST (alphabetical).
BREEDS = ("bulldog", "dachshund", "labrador", "corgi")
CLASS_LIST = ("bulldog", "corgi", "dachshund", "labrador")   # label index = position
LOCATIONS = ("beach", "desert", "dirt", "jungle", "mountain", "snow")
POOLS = (0, 1)
DEFAULT_PER_CELL = 3168      # images per (pool, location, breed) in the released dataset
DATASET_DIRNAME = "spawrious224"

FUR = ("black", "brown", "white", "")
POSES = ("sitting", "running", "")
TIMES_OF_DAY = ("pale sunrise", "sunset", "rainy day", "foggy day",
                "bright sunny day", "bright sunny day")

# The paper's template (section 4.2) ...
PAPER_TEMPLATE = ("one {fur} {animal} {pose} {location}, {tod}. highly detailed, with "
                  "cinematic lighting, 4k resolution, beautiful composition, hyperrealistic, "
                  "trending, cinematic, masterpiece, close up")
# ... and the one the authors' generator actually sent (emphasis brackets on the subject).
TEMPLATE = ("(((one {fur} {animal} {pose}))) {location}, {tod}. highly detailed, with "
            "cinematic lighting, 4k resolution, beautiful composition, hyperrealistic, "
            "trending, cinematic, masterpiece, close up")

ANIMAL_PHRASES = {
    "bulldog": "bulldog",
    "dachshund": "dachshund",
    "labrador": "labrador",
    "corgi": "welsh corgi dog",
}
LOCATION_PHRASES = {
    "beach": "playing fetch on a beach with a pier and ocean in the background",
    "desert": "in a hot, dry desert with cactuses around",
    "dirt": "in a park, with puddles, bushes and dirt in the background",
    "jungle": "in a jungle",
    "mountain": "on a rocky mountain",
    "snow": "in a snowy landscape with a cabin and a snowball in the background",
}
NEGATIVE_PROMPT = ("human, blurry, painting, cartoon, extra limbs, disfigured, deformed, "
                   "body out of frame, bad anatomy, watermark, two, multiple")
CAPTION_KEYWORDS = ("dog",)


def check_breed(name: str) -> str:
    if name not in BREEDS:
        raise UnknownNameError("breed", name, BREEDS)
    return name


def check_location(name: str) -> str:
    if name not in LOCATIONS:
        raise UnknownNameError("location", name, LOCATIONS)
    return name


def check_pool(pool: int | str) -> int:
    if str(pool) not in {str(p) for p in POOLS}:
        raise UnknownNameError("pool", str(pool), [str(p) for p in POOLS])
    return int(pool)
