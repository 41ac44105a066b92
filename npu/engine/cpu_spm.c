/* flm-serve's SentencePiece vocabularies in C (npu/load/spm.py): a GGUF `llama` tokenizer
 * (tokens and scores, no merges; Gemma 3's 262,144 tokens) as `tokenizers` would encode it
 * from the document npu/load/gguf_tokenizer.py writes, without building that library's BPE
 * model (0.6 s for Gemma 3, and 0.35 s more for the merges as Python objects):
 *
 *   fc_spm_pairs   the merges the scores imply: every cut of a token into two tokens;
 *   fc_spm_new     an encoder over the tokens, those merges in rank order, the added tokens;
 *   fc_spm_encode  a text's ids: `tokenizers`' pipeline for that document, step for step:
 *                  the added tokens split out first (leftmost, then longest, on the raw
 *                  text), each other piece normalized (U+2581 prepended when the file says
 *                  add_space_prefix and the piece is not empty; spaces to U+2581), then
 *                  BPE on the whole piece as one word: characters in the vocabulary, else
 *                  their bytes as <0xXX> pieces where all of them are pieces, else UNK (runs
 *                  of UNK fused, as the document's fuse_unk says, and placed as `tokenizers`
 *                  places them: after byte pieces that came while it was pending); then
 *                  merges by rank, ties by position (`tokenizers`' Word::merge_all, with its
 *                  check that a queued merge is still the pair's).
 * tests/npu/load/test_spm.py compares the encoder with `tokenizers` on random texts.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t fc_text_hash(const uint8_t *s, int64_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (int64_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    return h;
}

/* A slot: a token's id (-1: empty) and its hash's high half, compared before its text (a
 * miss reads the slots alone, not the tokens' places and bytes). */
typedef struct {
    int32_t id;
    uint32_t tag;
} FcSlot;

/* The slot of the text s[0 .. n) (hash h): the one holding it, else the empty one where it
 * would go (the table is never full). */
static uint64_t fc_slot_of(const FcSlot *slots, uint64_t mask, const uint8_t *joined,
                           const int64_t *start, const int64_t *len, const uint8_t *s,
                           int64_t n, uint64_t h) {
    const uint32_t tag = (uint32_t)(h >> 32);
    for (uint64_t at = h & mask;; at = (at + 1) & mask) {
        const FcSlot slot = slots[at];
        if (slot.id < 0 || (slot.tag == tag && len[slot.id] == n &&
                            memcmp(joined + start[slot.id], s, (size_t)n) == 0))
            return at;
    }
}

/* Each of `count` NUL-joined tokens' place in `joined`: 0, or -1 where there are fewer. */
static int fc_places(const uint8_t *joined, int64_t len_all, int64_t count, int64_t *start,
                     int64_t *len) {
    int64_t at = 0;
    for (int64_t i = 0; i < count; i++) {
        const uint8_t *end = memchr(joined + at, 0, (size_t)(len_all - at));
        const int64_t stop = end ? end - joined : len_all;
        start[i] = at;
        len[i] = stop - at;
        at = stop + 1;
        if (at > len_all + 1 || (i + 1 < count && !end)) return -1;
    }
    return 0;
}

/* A table of the texts of tokens ids[0 .. n) (all `count` tokens where ids is NULL) to
 * their ids, a text's last id winning (as a Python dict built in order); NULL: no memory. */
static FcSlot *fc_texts(const uint8_t *joined, const int64_t *start, const int64_t *len,
                        int64_t count, const int32_t *ids, int64_t n, uint64_t *mask) {
    if (!ids) n = count;
    uint64_t size = 16;
    while (size < 2 * (uint64_t)n) size <<= 1;
    FcSlot *slots = malloc(size * sizeof *slots);
    if (!slots) return NULL;
    for (uint64_t i = 0; i < size; i++) slots[i] = (FcSlot){-1, 0};
    *mask = size - 1;
    for (int64_t k = 0; k < n; k++) {
        const int64_t i = ids ? ids[k] : k;
        const uint8_t *s = joined + start[i];
        const uint64_t h = fc_text_hash(s, len[i]);
        slots[fc_slot_of(slots, *mask, joined, start, len, s, len[i], h)] =
            (FcSlot){(int32_t)i, (uint32_t)(h >> 32)};
    }
    return slots;
}

/* A SentencePiece vocabulary's implied merges (npu/load/gguf_tokenizer.py: `_spm_merges`,
 * a Python loop of 1.7 s over Gemma 3's 262,144 tokens): `count` tokens, their UTF-8 bytes
 * joined by NULs in `joined` (`len` bytes; no token holds a NUL). For every token and every
 * cut of it into two non-empty parts at a character boundary where both parts are tokens,
 * one triple (the token's id, the left part's id, the right part's id) in the order the
 * Python loop makes them; a text that several ids spell has the last of them (as a Python
 * dict built in order). Room: `cap` triples (a cut per byte is enough). Returns how many
 * were written; -1 when `cap` is too small or memory runs out. */
int64_t fc_spm_pairs(const uint8_t *joined, int64_t len_all, int64_t count,
                     int32_t *out_token, int32_t *out_left, int32_t *out_right, int64_t cap) {
    if (count <= 0) return 0;
    if (count > INT32_MAX) return -1;
    int64_t *start = malloc((size_t)count * sizeof *start);
    int64_t *len = malloc((size_t)count * sizeof *len);
    FcSlot *slots = NULL;
    uint64_t mask = 0;
    int64_t w = -1;
    if (!start || !len || fc_places(joined, len_all, count, start, len) ||
        !(slots = fc_texts(joined, start, len, count, NULL, 0, &mask)))
        goto done;
    w = 0;
    for (int64_t i = 0; i < count && w >= 0; i++) {
        const uint8_t *s = joined + start[i];
        const int64_t n = len[i];
        uint64_t left_hash = 1469598103934665603ull; /* FNV-1a of s[0 .. cut), as it grows */
        for (int64_t cut = 1; cut < n; cut++) {
            left_hash = (left_hash ^ s[cut - 1]) * 1099511628211ull;
            if ((s[cut] & 0xc0) == 0x80) continue; /* inside a character */
            const int32_t left =
                slots[fc_slot_of(slots, mask, joined, start, len, s, cut, left_hash)].id;
            if (left < 0) continue;
            const int32_t right = slots[fc_slot_of(slots, mask, joined, start, len, s + cut,
                                                   n - cut, fc_text_hash(s + cut, n - cut))].id;
            if (right < 0) continue;
            if (w >= cap) {
                w = -1;
                break;
            }
            out_token[w] = (int32_t)i;
            out_left[w] = left;
            out_right[w] = right;
            w++;
        }
    }
done:
    free(start);
    free(len);
    free(slots);
    return w;
}

/* -- the encoder ------------------------------------------------------------------------ */

#define FC_NO_PAIR UINT64_MAX

typedef struct {
    int64_t count;
    uint8_t *joined; /* the tokens' texts (a copy), NUL-joined */
    int64_t *start, *len;
    FcSlot *texts; /* a text -> its last id (the model's vocabulary) */
    uint64_t tmask;
    FcSlot *added; /* an added token's text -> its id */
    uint64_t amask;
    int64_t aoff[257]; /* alen[aoff[b] .. aoff[b + 1]): the added tokens' distinct byte */
    int64_t *alen;     /* lengths among those starting with byte b, longest first */
    uint64_t *pkey;    /* (left id << 32 | right id) -> rank, merged id; FC_NO_PAIR: empty */
    int32_t *prank, *pnew;
    uint64_t pmask;
    int32_t byte_id[256]; /* <0xXX>'s id, -1 where the vocabulary has none */
    int32_t unk;          /* -1: none (an unknown character is dropped) */
    int prefix;           /* U+2581 before each piece */
} FcSpm;

static inline uint64_t fc_pair_slot(uint64_t key, uint64_t mask) {
    uint64_t h = key * 0x9e3779b97f4a7c15ull;
    return (h ^ (h >> 31)) & mask;
}

/* The merge of (left, right): 1 with its rank and merged id, else 0. */
static inline int fc_pair(const FcSpm *t, int32_t left, int32_t right, int32_t *rank,
                          int32_t *merged) {
    const uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    for (uint64_t at = fc_pair_slot(key, t->pmask);; at = (at + 1) & t->pmask) {
        if (t->pkey[at] == FC_NO_PAIR) return 0;
        if (t->pkey[at] == key) {
            *rank = t->prank[at];
            *merged = t->pnew[at];
            return 1;
        }
    }
}

static inline int32_t fc_text_id(const FcSpm *t, const FcSlot *slots, uint64_t mask,
                                 const uint8_t *s, int64_t n) {
    return slots[fc_slot_of(slots, mask, t->joined, t->start, t->len, s, n,
                            fc_text_hash(s, n))].id;
}

void fc_spm_free(void *p) {
    FcSpm *t = p;
    if (!t) return;
    free(t->joined);
    free(t->start);
    free(t->len);
    free(t->texts);
    free(t->added);
    free(t->alen);
    free(t->pkey);
    free(t->prank);
    free(t->pnew);
    free(t);
}

static int fc_cmp_desc(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* An encoder: `count` NUL-joined tokens (copied); the merges (left[i], right[i]) into
 * token[i] in rank order (a pair listed twice: its last rank, as `tokenizers` builds its
 * map; the merged id is the last id of token[i]'s text); the added tokens' ids (their text
 * is their token's; none empty; each encodes as its text's last id); the UNK id (-1: none); `prefix`: add_space_prefix. NULL:
 * no memory, or ids out of range. */
void *fc_spm_new(const uint8_t *joined, int64_t len_all, int64_t count, const int32_t *left,
                 const int32_t *right, const int32_t *token, int64_t n_merges,
                 const int32_t *added, int64_t n_added, int32_t unk, int prefix) {
    if (count <= 0 || count > INT32_MAX || n_merges < 0 || n_added < 0 || unk >= count)
        return NULL;
    FcSpm *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->count = count;
    t->unk = unk < 0 ? -1 : unk;
    t->prefix = prefix != 0;
    t->joined = malloc((size_t)len_all + 1);
    t->start = malloc((size_t)count * sizeof *t->start);
    t->len = malloc((size_t)count * sizeof *t->len);
    if (!t->joined || !t->start || !t->len) goto fail;
    memcpy(t->joined, joined, (size_t)len_all);
    t->joined[len_all] = 0;
    if (fc_places(t->joined, len_all, count, t->start, t->len)) goto fail;
    for (int64_t k = 0; k < n_added; k++)
        if (added[k] < 0 || added[k] >= count || t->len[added[k]] == 0) goto fail;
    t->texts = fc_texts(t->joined, t->start, t->len, count, NULL, 0, &t->tmask);
    int32_t *ids = calloc((size_t)(n_added ? n_added : 1), sizeof *ids);
    if (!t->texts || !ids) {
        free(ids);
        goto fail;
    }
    if (t->unk >= 0) /* UNK too: its text's last id (`tokenizers` looks it up by text) */
        t->unk = fc_text_id(t, t->texts, t->tmask, t->joined + t->start[unk], t->len[unk]);
    /* an added token's id: its text's last (the vocabulary's, as `tokenizers` gives it) */
    for (int64_t k = 0; k < n_added; k++)
        ids[k] = fc_text_id(t, t->texts, t->tmask, t->joined + t->start[added[k]],
                            t->len[added[k]]);
    t->added = fc_texts(t->joined, t->start, t->len, count, ids, n_added, &t->amask);
    free(ids);
    t->alen = malloc((size_t)(n_added ? n_added : 1) * sizeof *t->alen);
    if (!t->added || !t->alen) goto fail;
    /* the added tokens' lengths by first byte, distinct, longest first */
    int64_t counts[256] = {0};
    for (int64_t k = 0; k < n_added; k++) counts[t->joined[t->start[added[k]]]]++;
    t->aoff[0] = 0;
    for (int b = 0; b < 256; b++) t->aoff[b + 1] = t->aoff[b] + counts[b];
    int64_t fill[256];
    memcpy(fill, t->aoff, sizeof fill);
    for (int64_t k = 0; k < n_added; k++) {
        const int64_t i = added[k];
        t->alen[fill[t->joined[t->start[i]]]++] = t->len[i];
    }
    int64_t w = 0;
    for (int b = 0; b < 256; b++) {
        const int64_t lo = t->aoff[b], hi = t->aoff[b + 1];
        qsort(t->alen + lo, (size_t)(hi - lo), sizeof *t->alen, fc_cmp_desc);
        t->aoff[b] = w;
        for (int64_t k = lo; k < hi; k++)
            if (k == lo || t->alen[k] != t->alen[k - 1]) t->alen[w++] = t->alen[k];
    }
    t->aoff[256] = w;
    /* the merges */
    uint64_t size = 16; /* at most 2/3 full (Gemma 3's 515k merges: 16 MB) */
    while (size < (uint64_t)n_merges + (uint64_t)n_merges / 2) size <<= 1;
    t->pmask = size - 1;
    t->pkey = malloc(size * sizeof *t->pkey);
    t->prank = malloc(size * sizeof *t->prank);
    t->pnew = malloc(size * sizeof *t->pnew);
    if (!t->pkey || !t->prank || !t->pnew) goto fail;
    for (uint64_t i = 0; i < size; i++) t->pkey[i] = FC_NO_PAIR;
    for (int64_t r = 0; r < n_merges; r++) {
        if (left[r] < 0 || left[r] >= count || right[r] < 0 || right[r] >= count ||
            token[r] < 0 || token[r] >= count || r > INT32_MAX)
            goto fail;
        const uint64_t key = (uint64_t)(uint32_t)left[r] << 32 | (uint32_t)right[r];
        uint64_t at = fc_pair_slot(key, t->pmask);
        while (t->pkey[at] != FC_NO_PAIR && t->pkey[at] != key) at = (at + 1) & t->pmask;
        t->pkey[at] = key;
        t->prank[at] = (int32_t)r;
        t->pnew[at] = fc_text_id(t, t->texts, t->tmask, t->joined + t->start[token[r]],
                                 t->len[token[r]]);
    }
    for (int b = 0; b < 256; b++) {
        static const char hex[] = "0123456789ABCDEF";
        const uint8_t piece[6] = {'<', '0', 'x', (uint8_t)hex[b >> 4], (uint8_t)hex[b & 15], '>'};
        t->byte_id[b] = fc_text_id(t, t->texts, t->tmask, piece, 6);
    }
    return t;
fail:
    fc_spm_free(t);
    return NULL;
}

typedef struct {
    int32_t c, prev, next;
    int64_t len; /* bytes; 0: merged into the symbol before it */
} FcSym;

typedef struct {
    int32_t rank, pos, merged;
} FcMerge;

static inline int fc_before(FcMerge a, FcMerge b) {
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void fc_push(FcMerge *heap, int64_t *n, FcMerge m) {
    int64_t i = (*n)++;
    while (i > 0) {
        const int64_t up = (i - 1) / 2;
        if (!fc_before(m, heap[up])) break;
        heap[i] = heap[up];
        i = up;
    }
    heap[i] = m;
}

static FcMerge fc_pop(FcMerge *heap, int64_t *n) {
    const FcMerge top = heap[0], last = heap[--*n];
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && fc_before(heap[c + 1], heap[c])) c++;
        if (!fc_before(heap[c], last)) break;
        heap[i] = heap[c];
        i = c;
    }
    if (*n > 0) heap[i] = last;
    return top;
}

static inline void fc_add(FcSym *sym, int64_t *ns, int32_t c, int64_t len) {
    const int64_t i = (*ns)++;
    sym[i] = (FcSym){c, (int32_t)(i - 1), -1, len};
    if (i > 0) sym[i - 1].next = (int32_t)i;
}

static inline int fc_char_bytes(uint8_t lead) {
    return lead < 0x80 ? 1 : lead < 0xe0 ? 2 : lead < 0xf0 ? 3 : 4;
}

/* BPE over one normalized piece p[0 .. m) as one word; its ids appended to out[*w ..].
 * sym: room for m symbols, heap: room for 3 m merges. */
static void fc_word(const FcSpm *t, const uint8_t *p, int64_t m, FcSym *sym, FcMerge *heap,
                    int32_t *out, int64_t *w) {
    int64_t ns = 0, unk_len = 0;
    for (int64_t i = 0; i < m;) {
        int64_t cl = fc_char_bytes(p[i]);
        if (cl > m - i) cl = m - i;
        const int32_t id = fc_text_id(t, t->texts, t->tmask, p + i, cl);
        if (id >= 0) {
            if (unk_len) fc_add(sym, &ns, t->unk, unk_len);
            unk_len = 0;
            fc_add(sym, &ns, id, cl);
        } else {
            int bytes = 1;
            for (int64_t k = 0; k < cl; k++) bytes &= t->byte_id[p[i + k]] >= 0;
            if (bytes)
                for (int64_t k = 0; k < cl; k++) fc_add(sym, &ns, t->byte_id[p[i + k]], 1);
            else if (t->unk >= 0)
                unk_len += cl; /* fused with a pending one */
        }
        i += cl;
    }
    if (unk_len) fc_add(sym, &ns, t->unk, unk_len);
    int64_t nh = 0;
    int32_t rank, merged;
    for (int64_t i = 0; i + 1 < ns; i++)
        if (fc_pair(t, sym[i].c, sym[i + 1].c, &rank, &merged))
            fc_push(heap, &nh, (FcMerge){rank, (int32_t)i, merged});
    while (nh > 0) {
        const FcMerge top = fc_pop(heap, &nh);
        FcSym *cur = &sym[top.pos];
        if (cur->len == 0 || cur->next == -1) continue;
        const FcSym right = sym[cur->next];
        /* a stale entry: the pair there now does not merge into this */
        if (!fc_pair(t, cur->c, right.c, &rank, &merged) || merged != top.merged) continue;
        sym[cur->next].len = 0;
        cur->c = top.merged;
        cur->len += right.len;
        cur->next = right.next;
        if (right.next > -1 && right.next < ns) sym[right.next].prev = top.pos;
        if (cur->prev >= 0 && fc_pair(t, sym[cur->prev].c, cur->c, &rank, &merged))
            fc_push(heap, &nh, (FcMerge){rank, cur->prev, merged});
        if (cur->next > -1 && cur->next < ns && fc_pair(t, cur->c, sym[cur->next].c, &rank,
                                                         &merged))
            fc_push(heap, &nh, (FcMerge){rank, top.pos, merged});
    }
    for (int64_t i = 0; i < ns; i++)
        if (sym[i].len) out[(*w)++] = sym[i].c;
}

/* The longest added token at s[0 ..) (n bytes left): its id, else -1 (*len: its bytes). */
static int32_t fc_added_at(const FcSpm *t, const uint8_t *s, int64_t n, int64_t *len) {
    const int64_t lo = t->aoff[s[0]], hi = t->aoff[s[0] + 1];
    for (int64_t k = lo; k < hi; k++) {
        const int64_t l = t->alen[k];
        if (l > n) continue;
        const int32_t id = fc_text_id(t, t->added, t->amask, s, l);
        if (id >= 0) {
            *len = l;
            return id;
        }
    }
    return -1;
}

/* The ids of the UTF-8 text s[0 .. n) into out (room: cap ids; 3 + 4 n is always enough: a
 * piece of L bytes makes at most 3 + 3 L ids, an added token of at least 1 byte one).
 * Returns how many; -1: no room, no memory, or a text past what int32 positions hold. */
int64_t fc_spm_encode(const void *p, const uint8_t *s, int64_t n, int32_t *out, int64_t cap) {
    const FcSpm *t = p;
    if (n < 0 || n > (INT32_MAX - 3) / 3 || cap < 3 + 4 * n) return -1;
    const int64_t room = 3 + 3 * n; /* a piece normalized: U+2581 first, a space 3 bytes */
    uint8_t *norm = malloc((size_t)room);
    FcSym *sym = malloc((size_t)room * sizeof *sym);
    FcMerge *heap = malloc((size_t)(3 * room) * sizeof *heap);
    int64_t w = -1;
    if (!norm || !sym || !heap) goto done;
    w = 0;
    int64_t piece = 0; /* where the piece being read starts */
    for (int64_t i = 0; i <= n;) {
        int64_t len = 0;
        const int32_t id = i < n ? fc_added_at(t, s + i, n - i, &len) : -1;
        if (i < n && id < 0) {
            i++;
            continue;
        }
        if (i > piece) { /* the piece before: normalized, then BPE */
            int64_t m = 0;
            if (t->prefix) {
                norm[m++] = 0xe2, norm[m++] = 0x96, norm[m++] = 0x81;
            }
            for (int64_t k = piece; k < i; k++)
                if (s[k] == ' ')
                    norm[m++] = 0xe2, norm[m++] = 0x96, norm[m++] = 0x81;
                else
                    norm[m++] = s[k];
            fc_word(t, norm, m, sym, heap, out, &w);
        }
        if (i == n) break;
        out[w++] = id;
        i += len;
        piece = i;
    }
done:
    free(norm);
    free(sym);
    free(heap);
    return w;
}
