# make_text_shards DIR: a small corpus of varied sentences, prepared as byte shards in DIR.
make_text_shards() {
  local out=$1
  /usr/bin/python3 - <<'PY'
import random
random.seed(7)
words = ("the and of to in he that shall lord unto his i a for they be is him not them it "
         "with all thou thy was which my me said but ye their have will").split()
for d in range(6):
    with open(f"doc{d}.txt", "w") as f:
        for s in range(400):
            n = random.randint(5, 14)
            f.write(" ".join(random.choice(words) for _ in range(n)).capitalize() + ".\n")
PY
  "$DDILOCO" prepare-data --source files --out "$out" --val-fraction 0.2 doc0.txt doc1.txt doc2.txt doc3.txt doc4.txt doc5.txt >/dev/null
}
