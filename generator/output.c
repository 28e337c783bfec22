/* output.c: writing generated variants to disk, all or nothing. Each output
 * directory is built complete in a fresh sibling (out/.NAME.tmp-PID-XXXXXX)
 * and then swapped into place with one rename (an atomic exchange where the
 * kernel offers it), so a reader sees the old directory or the new one, never
 * a mix, and any failure before the swap leaves every target as it was.
 *
 * symmgen deletes only what it wrote: a directory is replaced only when its
 * manifest.json is ours and every file in it is one that manifest lists with
 * a content hash it still matches (checked again on the old tree once it is
 * swapped out, just before it is deleted). Staging directories carry the
 * writer's pid and are locked while it lives, so that the next run removes
 * those of a writer that died (kill -9) and no others. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sg.h"
#include "../runtime/json.h"   /* the runtime's JSON reader, compiled into symmgen too */
#include "../runtime/sha256.h" /* and its SHA-256 */

#define FILE_MODE 0644
#define DIR_MODE 0755
/* The largest manifest.json read to recognise our own (16384 variants of a
 * few KiB each). */
#define MANIFEST_MAX ((off_t)256 << 20)

/* How a target was replaced, so that it can be put back. */
enum swap_kind { SWAP_NONE, SWAP_EXCHANGED, SWAP_CREATED, SWAP_MOVED_ASIDE };

typedef struct staged {
    char target[PATH_MAX];
    char tmp[PATH_MAX];   /* the new tree; after an exchange, the old one */
    char old[PATH_MAX];   /* SWAP_MOVED_ASIDE: where the old tree went */
    enum swap_kind swap;
    int locks[2];         /* flock'd descriptors of the directories we made (or -1) */
} staged;

/* Parent directories this run created, removed again on failure. */
typedef struct created_dirs {
    char paths[16][PATH_MAX];
    int count;
} created_dirs;

/* The first error of the remove_tree in progress (nftw passes no data). */
static int remove_error;

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    if (remove(path) != 0 && remove_error == 0)
        remove_error = errno;
    return 0; /* on with the others */
}

/* Removes the tree at path. Returns 0, or the errno of what is left of it. */
static int remove_tree(const char *path)
{
    struct stat st;
    if (!path[0])
        return 0;
    remove_error = 0;
    if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0 && remove_error == 0)
        remove_error = errno;
    if (lstat(path, &st) != 0 && errno == ENOENT)
        return 0;
    return remove_error ? remove_error : EEXIST;
}

/* dir without trailing slashes, split into parent and base name. */
static int split_target(const char *dir, char *target, char *parent, char *base, sg_diag *diag)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    if (n == 0 || n >= PATH_MAX - 32) {
        sg_diag_add(diag, "output directory \"%s\": expected a path of 1..%d bytes", dir, PATH_MAX - 32);
        return -1;
    }
    memcpy(target, dir, n);
    target[n] = '\0';
    const char *slash = strrchr(target, '/');
    if (!slash) {
        strcpy(parent, ".");
        strcpy(base, target);
    } else {
        size_t pn = slash == target ? 1 : (size_t)(slash - target);
        memcpy(parent, target, pn);
        parent[pn] = '\0';
        strcpy(base, slash + 1);
    }
    if (strcmp(base, ".") == 0 || strcmp(base, "..") == 0 || strcmp(target, "/") == 0) {
        sg_diag_add(diag, "output directory %s: expected a directory that can be replaced, "
                    "not \".\", \"..\" or \"/\"", dir);
        return -1;
    }
    return 0;
}

/* Reads dir/manifest.json whole (at most MANIFEST_MAX bytes). Returns the
 * text, or NULL with why saying what is wrong. */
static char *read_manifest(const char *dir, size_t *len, char *why, size_t why_size)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    struct stat st;
    if (lstat(path, &st) != 0) {
        snprintf(why, why_size, errno == ENOENT ? "no manifest.json" : "manifest.json: %s", strerror(errno));
        return NULL;
    }
    if (!S_ISREG(st.st_mode) || st.st_size > MANIFEST_MAX) {
        snprintf(why, why_size, "manifest.json is %s", S_ISREG(st.st_mode) ? "larger than any symmgen writes"
                                                                           : "not a regular file");
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    char *text = f ? malloc((size_t)st.st_size + 1) : NULL;
    if (text) {
        *len = fread(text, 1, (size_t)st.st_size + 1, f);
        if (ferror(f)) {
            free(text);
            text = NULL;
        }
    }
    if (!text)
        snprintf(why, why_size, "manifest.json: cannot read it: %s", strerror(errno ? errno : EIO));
    if (f)
        fclose(f);
    return text;
}

/* The root of a manifest symmgen wrote: a JSON object with a "format" of
 * 1..SG_MANIFEST_FORMAT (an older symmgen's output may be replaced) and a
 * "symmgen" version string. NULL (and why) for any other text. */
static const symm_json *our_manifest(const char *text, size_t len, symm_json_doc **doc, char *why,
                                     size_t why_size)
{
    int line = 0, col = 0;
    char err[256] = "";
    int rc = symm_json_parse(text, len, doc, &line, &col, err, sizeof err);
    if (rc != SYMM_JSON_OK) {
        *doc = NULL;
        if (rc == SYMM_JSON_NOMEM)
            snprintf(why, why_size, "manifest.json: out of memory reading it");
        else if (rc == SYMM_JSON_TOO_LARGE)
            snprintf(why, why_size, "manifest.json: %s", err);
        else
            snprintf(why, why_size, "manifest.json is not JSON: line %d, column %d: %s", line, col, err);
        return NULL;
    }
    const symm_json *root = symm_json_root(*doc);
    const symm_json *format = symm_json_member(root, "format", NULL);
    const symm_json *version = symm_json_member(root, "symmgen", NULL);
    if (root && root->type == SYMM_JSON_OBJECT && format && format->type == SYMM_JSON_NUMBER &&
        format->is_int && format->integer >= 1 && format->integer <= SG_MANIFEST_FORMAT && version &&
        version->type == SYMM_JSON_STRING)
        return root;
    snprintf(why, why_size, "manifest.json is not a symmgen manifest: expected an object with "
             "\"format\": 1..%d and a \"symmgen\" version string", SG_MANIFEST_FORMAT);
    return NULL;
}

/* A file the manifest says symmgen wrote: its name, the variant that lists
 * it and as what (ROLE_CU, ROLE_H or ROLE_C). */
enum { ROLE_CU, ROLE_H, ROLE_C, ROLES };
static const char *const role_keys[ROLES] = { "cu", "h", "c" };

typedef struct listed {
    const char *name;
    size_t variant;
    int role;
} listed;

/* What a manifest records of the files of one variant. */
typedef struct listed_variant {
    const char *file[ROLES];   /* NULL when not listed */
    const char *source_sha256; /* of cu */
    const char *content_sha256; /* of cu, h and c, in that order */
} listed_variant;

typedef struct listing {
    listed_variant *variants;
    size_t n_variants;
    listed *files;             /* sorted by name */
    size_t n_files;
} listing;

static void listing_free(listing *l)
{
    free(l->variants);
    free(l->files);
    memset(l, 0, sizeof *l);
}

static int compare_listed(const void *a, const void *b)
{
    return strcmp(((const listed *)a)->name, ((const listed *)b)->name);
}

static bool is_hex64(const symm_json *v)
{
    return v && v->type == SYMM_JSON_STRING && v->len == 64 && strspn(v->str, "0123456789abcdef") == 64;
}

/* A name symmgen writes into the directory itself: no path, no dot name. */
static bool plain_file_name(const symm_json *v)
{
    return v->type == SYMM_JSON_STRING && v->len > 0 && strlen(v->str) == v->len && !strchr(v->str, '/') &&
           strcmp(v->str, ".") != 0 && strcmp(v->str, "..") != 0 && strcmp(v->str, "manifest.json") != 0;
}

/* What the manifest says symmgen wrote, with the hashes that identify it.
 * False (why set) for a "files" entry symmgen never writes: another key, a
 * path, a file without both hashes. */
static bool list_files(const symm_json *manifest, listing *l, char *why, size_t why_size)
{
    const symm_json *variants = symm_json_member(manifest, "variants", NULL);
    const symm_json *first = variants && variants->type == SYMM_JSON_ARRAY ? variants->first : NULL;
    size_t nv = variants && variants->type == SYMM_JSON_ARRAY ? variants->count : 0;
    l->variants = calloc(nv + 1, sizeof *l->variants);
    l->files = calloc(nv * ROLES + 1, sizeof *l->files);
    if (!l->variants || !l->files) {
        snprintf(why, why_size, "out of memory reading its manifest");
        return false;
    }
    size_t i = 0;
    for (const symm_json *v = first; v; v = v->next, i++) {
        const symm_json *files = symm_json_member(v, "files", NULL);
        if (!files)
            continue;
        listed_variant *lv = &l->variants[i];
        const symm_json *source = symm_json_member(v, "source_sha256", NULL);
        const symm_json *content = symm_json_member(v, "content_sha256", NULL);
        for (const symm_json *f = files->type == SYMM_JSON_OBJECT ? files->first : NULL; f; f = f->next) {
            int role = 0;
            while (role < ROLES && !(strlen(role_keys[role]) == f->key_len && strcmp(f->key, role_keys[role]) == 0))
                role++;
            if (role == ROLES || !plain_file_name(f) || lv->file[role]) {
                snprintf(why, why_size, "its manifest lists a file symmgen does not write (variants[%zu].files: "
                         "\"%.64s\")", i, f->key);
                return false;
            }
            lv->file[role] = f->str;
            l->files[l->n_files++] = (listed){ f->str, i, role };
        }
        if (!is_hex64(source) || !is_hex64(content)) {
            snprintf(why, why_size, "its manifest records no content hash of the files of variants[%zu]", i);
            return false;
        }
        lv->source_sha256 = source->str;
        lv->content_sha256 = content->str;
    }
    l->n_variants = i;
    qsort(l->files, l->n_files, sizeof *l->files, compare_listed);
    return true;
}

/* Adds the file called name in dir_fd to h. -1 when it cannot be read as a
 * regular file (a link is not followed). */
static int hash_file(int dir_fd, const char *name, symm_sha256_ctx *h)
{
    int fd = openat(dir_fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    char buf[65536];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR))
        if (n > 0)
            symm_sha256_update(h, buf, (size_t)n);
    close(fd);
    return n < 0 ? -1 : 0;
}

static bool digest_is(symm_sha256_ctx *h, const char *hex)
{
    uint8_t digest[SYMM_SHA256_SIZE];
    char got[SYMM_SHA256_HEX_SIZE];
    symm_sha256_final(h, digest);
    symm_sha256_hex(digest, got);
    return strcmp(got, hex) == 0;
}

/* Each of a variant's files that is there still holds what symmgen wrote:
 * its .cu the manifest's source_sha256, its .h and .c (which only the
 * content hash covers, with the .cu) the content_sha256. */
static bool variant_files_match(int dir_fd, const listed_variant *lv, const bool *present, char *why,
                                size_t why_size)
{
    symm_sha256_ctx h;
    if (present[ROLE_CU]) {
        symm_sha256_init(&h);
        if (hash_file(dir_fd, lv->file[ROLE_CU], &h) != 0 || !digest_is(&h, lv->source_sha256)) {
            snprintf(why, why_size, "%s was changed since symmgen wrote it (it does not match the hash its "
                     "manifest records): move it away or delete it yourself", lv->file[ROLE_CU]);
            return false;
        }
    }
    if (!present[ROLE_H] && !present[ROLE_C])
        return true;
    for (int r = 0; r < ROLES; r++)
        if (!present[r]) {
            snprintf(why, why_size, "%s cannot be checked against its manifest's hash (%s is missing): move "
                     "it away or delete it yourself", lv->file[present[ROLE_H] ? ROLE_H : ROLE_C],
                     lv->file[r] ? lv->file[r] : role_keys[r]);
            return false;
        }
    symm_sha256_init(&h);
    for (int r = 0; r < ROLES; r++)
        if (hash_file(dir_fd, lv->file[r], &h) != 0) {
            snprintf(why, why_size, "%s cannot be read", lv->file[r]);
            return false;
        }
    if (!digest_is(&h, lv->content_sha256)) {
        snprintf(why, why_size, "%s, %s or %s was changed since symmgen wrote it (they do not match the hash "
                 "their manifest records): move them away or delete them yourself", lv->file[ROLE_CU],
                 lv->file[ROLE_H], lv->file[ROLE_C]);
        return false;
    }
    return true;
}

/* Every entry of dir is a regular file that the manifest lists (and, with
 * hashes, still holds what symmgen wrote). */
static bool only_listed_files(const char *dir, const symm_json *manifest, bool hashes, char *why, size_t why_size)
{
    listing l = { 0 };
    if (!list_files(manifest, &l, why, why_size)) {
        listing_free(&l);
        return false;
    }
    bool *present = calloc(l.n_variants * ROLES + 1, sizeof *present);
    DIR *d = present ? opendir(dir) : NULL;
    if (!d) {
        snprintf(why, why_size, "cannot list it: %s", present ? strerror(errno) : "out of memory");
        free(present);
        listing_free(&l);
        return false;
    }
    bool ok = true;
    for (struct dirent *e; ok && (e = readdir(d));) {
        const char *name = e->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0 || strcmp(name, "manifest.json") == 0)
            continue;
        struct stat st;
        listed key = { .name = name };
        const listed *f = bsearch(&key, l.files, l.n_files, sizeof *l.files, compare_listed);
        ok = fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) && f;
        if (!ok) {
            snprintf(why, why_size, "it holds %s, which symmgen did not write", name);
            break;
        }
        /* (A name listed twice: every listing of it is checked.) */
        for (const listed *g = f; g > l.files && strcmp(g[-1].name, name) == 0; g--)
            present[g[-1].variant * ROLES + (size_t)g[-1].role] = true;
        for (const listed *g = f; g < l.files + l.n_files && strcmp(g->name, name) == 0; g++)
            present[g->variant * ROLES + (size_t)g->role] = true;
    }
    for (size_t v = 0; ok && hashes && v < l.n_variants; v++)
        ok = variant_files_match(dirfd(d), &l.variants[v], present + v * ROLES, why, why_size);
    closedir(d);
    free(present);
    listing_free(&l);
    return ok;
}

/* A directory symmgen wrote and nothing else touched: the whole directory is
 * replaced, so anything in it that is not ours would be lost. */
static bool looks_ours(const char *dir, bool hashes, char *why, size_t why_size)
{
    size_t len = 0;
    char *text = read_manifest(dir, &len, why, why_size);
    if (!text)
        return false;
    symm_json_doc *doc = NULL;
    const symm_json *manifest = our_manifest(text, len, &doc, why, why_size);
    free(text);
    bool ours = manifest && only_listed_files(dir, manifest, hashes, why, why_size);
    symm_json_free(doc);
    return ours;
}

static bool dir_is_empty(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return false;
    bool empty = true;
    for (struct dirent *e; empty && (e = readdir(d));)
        empty = strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0;
    closedir(d);
    return empty;
}

/* May the tree at dir (named shown in messages) be replaced? With hashes,
 * every file is checked against the manifest's hashes too (reading them
 * all); without, only the manifest and the names. */
static int check_tree(const char *dir, const char *shown, bool hashes, sg_diag *diag)
{
    struct stat st;
    if (lstat(dir, &st) != 0) {
        if (errno == ENOENT)
            return SG_EXIT_OK;
        sg_diag_add(diag, "%s: %s", shown, strerror(errno));
        return SG_EXIT_ERROR;
    }
    char why[PATH_MAX + 256] = "";
    if (S_ISLNK(st.st_mode))
        snprintf(why, sizeof why, "a symbolic link");
    else if (!S_ISDIR(st.st_mode))
        snprintf(why, sizeof why, "not a directory");
    else if (dir_is_empty(dir) || looks_ours(dir, hashes, why, sizeof why))
        return SG_EXIT_OK;
    sg_diag_add(diag, "%s exists and is not a symmgen output directory (%s): refusing to replace it; "
                "nothing was written", shown, why);
    return SG_EXIT_ERROR;
}

int sg_output_check_target(const char *dir, sg_diag *diag)
{
    return check_tree(dir, dir, true, diag);
}

/* mkdir -p of dir, recording what it made. */
static int make_parents(const char *dir, created_dirs *made, sg_diag *diag)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1;; p++) {
        bool last = *p == '\0';
        if (*p != '/' && !last)
            continue;
        *p = '\0';
        if (mkdir(path, DIR_MODE) == 0) {
            if (made->count < (int)(sizeof made->paths / sizeof made->paths[0]))
                snprintf(made->paths[made->count++], PATH_MAX, "%s", path);
        } else if (errno != EEXIST) {
            sg_diag_add(diag, "cannot create directory %s: %s", path, strerror(errno));
            return -1;
        }
        if (last)
            return 0;
        *p = '/';
    }
}

static int write_file(const char *dir, const char *name, const sg_buf *content, const char *target,
                      sg_diag *diag)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, FILE_MODE);
    if (fd < 0)
        goto fail;
    for (size_t done = 0; done < content->len;) {
        ssize_t n = write(fd, content->data + done, content->len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n == 0)
                errno = EIO;
            int saved = errno;
            close(fd);
            errno = saved;
            goto fail;
        }
        done += (size_t)n;
    }
    /* The mode is part of the output: not left to the umask. */
    if (fchmod(fd, FILE_MODE) != 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        goto fail;
    }
    if (close(fd) != 0)
        goto fail;
    return 0;
fail:
    sg_diag_add(diag, "cannot write %s: %s (%s left as it was)", path, strerror(errno), target);
    return -1;
}

static int write_tree(const sg_output *o, const char *dir, sg_diag *diag)
{
    char name[SG_NAME_MAX + 8];
    for (size_t i = 0; i < o->count; i++) {
        const sg_generated *g = &o->variants[i];
        snprintf(name, sizeof name, "%s.cu", g->variant->name);
        if (write_file(dir, name, &g->cu, o->dir, diag) != 0)
            return -1;
        snprintf(name, sizeof name, "%s.h", g->variant->name);
        if (write_file(dir, name, &g->h, o->dir, diag) != 0)
            return -1;
        snprintf(name, sizeof name, "%s.c", g->variant->name);
        if (write_file(dir, name, &g->c, o->dir, diag) != 0)
            return -1;
    }
    sg_buf manifest = {0};
    sg_manifest(o->spec_path, o->variants, o->count, &manifest);
    int rc = write_file(dir, "manifest.json", &manifest, o->dir, diag);
    sg_buf_free(&manifest);
    return rc;
}

/* A fresh, hidden directory beside the target, PARENT/.BASE.KIND-PID-XXXXXX,
 * locked (flock) for as long as this process lives: remove_stale leaves it
 * alone. *lock receives the locked descriptor. */
static int make_sibling(char *out, const char *parent, const char *base, const char *kind, int *lock,
                        sg_diag *diag)
{
    int n = snprintf(out, PATH_MAX, "%s/.%s.%s-%ld-XXXXXX", parent, base, kind, (long)getpid());
    if (n < 0 || n >= PATH_MAX || !mkdtemp(out)) {
        sg_diag_add(diag, "cannot create a directory beside %s/%s: %s", parent, base,
                    n < 0 || n >= PATH_MAX ? "path too long" : strerror(errno));
        out[0] = '\0';
        return -1;
    }
    *lock = open(out, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (*lock >= 0)
        flock(*lock, LOCK_EX | LOCK_NB);
    return 0;
}

/* The pid in a staging directory's name .BASE.KIND-PID-XXXXXX (KIND tmp or
 * old), or 0 when name is not one for base. */
static long staging_pid(const char *name, const char *base)
{
    size_t bl = strlen(base);
    if (name[0] != '.' || strncmp(name + 1, base, bl) != 0 || name[1 + bl] != '.')
        return 0;
    const char *kind = name + 2 + bl;
    if (strncmp(kind, "tmp-", 4) != 0 && strncmp(kind, "old-", 4) != 0)
        return 0;
    char *end;
    long pid = strtol(kind + 4, &end, 10);
    if (pid <= 0 || end == kind + 4 || *end != '-' || strlen(end + 1) != 6)
        return 0;
    return pid;
}

/* Removes the staging directories beside base that a writer left when it
 * died (kill -9, a crash): named for a process that no longer exists, ours,
 * and not locked by anyone (the lock also covers a writer whose pid this
 * system cannot see, in another pid namespace sharing the directory). */
static void remove_stale(const char *parent, const char *base)
{
    DIR *d = opendir(parent);
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d));) {
        long pid = staging_pid(e->d_name, base);
        if (pid == 0 || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode) ||
            st.st_uid != geteuid())
            continue;
        int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
            continue;
        char path[PATH_MAX];
        if (flock(fd, LOCK_EX | LOCK_NB) == 0 &&
            snprintf(path, sizeof path, "%s/%s", parent, e->d_name) < (int)sizeof path)
            remove_tree(path);
        close(fd);
    }
    closedir(d);
}

/* Build o's tree in a fresh directory beside its target. */
static int stage(const sg_output *o, staged *s, created_dirs *made, sg_diag *diag)
{
    char parent[PATH_MAX], base[PATH_MAX];
    if (split_target(o->dir, s->target, parent, base, diag) != 0)
        return -1;
    if (make_parents(parent, made, diag) != 0)
        return -1;
    remove_stale(parent, base);
    if (make_sibling(s->tmp, parent, base, "tmp", &s->locks[0], diag) != 0)
        return -1;
    if (chmod(s->tmp, DIR_MODE) != 0) {
        sg_diag_add(diag, "%s: %s", s->tmp, strerror(errno));
        return -1;
    }
    return write_tree(o, s->tmp, diag);
}

static bool unsupported(int err) { return err == EINVAL || err == ENOSYS || err == ENOTSUP; }

static void swap_back(staged *s);

/* The tree that swap_in took out of the target (at path) is deleted once
 * all swaps are done: it is checked now, where no one else will swap it,
 * file by file against its manifest's hashes. Refused, it goes back. */
static int check_swapped_out(staged *s, const char *path, sg_diag *diag)
{
    if (check_tree(path, s->target, true, diag) == SG_EXIT_OK)
        return 0;
    swap_back(s);
    return -1;
}

/* Put s's new tree in place of its target, keeping the old tree to restore.
 * Whoever created the target or took it away since we looked (another
 * symmgen writing the same output), the swap is retried as it now stands:
 * two first runs racing end like two later ones, the last one's output in
 * place. */
static int swap_in(staged *s, sg_diag *diag)
{
    for (int attempt = 0; attempt < 8; attempt++) {
        struct stat st;
        if (lstat(s->target, &st) != 0 && errno == ENOENT) {
            if (renameat2(AT_FDCWD, s->tmp, AT_FDCWD, s->target, RENAME_NOREPLACE) == 0 ||
                (unsupported(errno) && rename(s->tmp, s->target) == 0)) {
                s->swap = SWAP_CREATED;
                return 0;
            }
            if (errno == EEXIST || errno == ENOTEMPTY)
                continue;
            break;
        }
        if (renameat2(AT_FDCWD, s->tmp, AT_FDCWD, s->target, RENAME_EXCHANGE) == 0) {
            s->swap = SWAP_EXCHANGED;
            return check_swapped_out(s, s->tmp, diag);
        }
        if (errno == ENOENT)
            continue;
        if (!unsupported(errno))
            break;
        /* No atomic exchange here: move the old tree aside (onto an empty
         * directory of ours), then the new one in. */
        char parent[PATH_MAX], base[PATH_MAX], target[PATH_MAX];
        if (split_target(s->target, target, parent, base, diag) != 0)
            return -1;
        if (!s->old[0] && make_sibling(s->old, parent, base, "old", &s->locks[1], diag) != 0)
            return -1;
        if (rename(s->target, s->old) != 0) {
            if (errno == ENOENT)
                continue;
            break;
        }
        if (rename(s->tmp, s->target) == 0) {
            s->swap = SWAP_MOVED_ASIDE;
            return check_swapped_out(s, s->old, diag);
        }
        int saved = errno;
        /* Should the old tree not go back, it stays where it is, whole. */
        if (rename(s->old, s->target) != 0)
            s->old[0] = '\0';
        errno = saved;
        break;
    }
    sg_diag_add(diag, "cannot move %s into place as %s: %s (%s left as it was)", s->tmp, s->target,
                strerror(errno), s->target);
    return -1;
}

/* Undo swap_in: the old tree back at the target, the new one at tmp. If a
 * step fails, nothing of this output is removed afterwards: a user's tree is
 * never deleted by a rollback that went wrong. */
static void swap_back(staged *s)
{
    bool ok = true;
    switch (s->swap) {
    case SWAP_EXCHANGED:
        ok = renameat2(AT_FDCWD, s->tmp, AT_FDCWD, s->target, RENAME_EXCHANGE) == 0;
        break;
    case SWAP_CREATED:
        ok = rename(s->target, s->tmp) == 0;
        break;
    case SWAP_MOVED_ASIDE:
        ok = rename(s->target, s->tmp) == 0 && rename(s->old, s->target) == 0;
        break;
    case SWAP_NONE:
        break;
    }
    if (!ok)
        s->tmp[0] = s->old[0] = '\0';
    s->swap = SWAP_NONE;
}

int sg_output_write(const sg_output *outs, size_t n, const sg_compile_opts *compile, sg_diag *diag)
{
    int status = SG_EXIT_OK;
    /* The names now, the hashes (reading every file) once the old tree is
     * swapped out (check_swapped_out). */
    for (size_t i = 0; i < n; i++)
        if (check_tree(outs[i].dir, outs[i].dir, false, diag) != SG_EXIT_OK)
            status = SG_EXIT_ERROR;
    if (status != SG_EXIT_OK)
        return status;

    /* Compile before anything touches the disk: a failure or an interrupt
     * during the slow part leaves nothing behind. */
    if (compile) {
        size_t total = 0;
        for (size_t i = 0; i < n; i++)
            total += outs[i].count;
        const sg_generated **all = calloc(total ? total : 1, sizeof *all);
        if (!all) {
            sg_diag_add(diag, "internal error: out of memory");
            return SG_EXIT_INTERNAL;
        }
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < outs[i].count; j++)
                all[k++] = &outs[i].variants[j];
        status = sg_compile_all(all, total, compile, diag);
        free(all);
        if (status != SG_EXIT_OK)
            return status;
    }

    staged *st = calloc(n ? n : 1, sizeof *st);
    created_dirs *made = calloc(1, sizeof *made);
    if (!st || !made) {
        free(st);
        free(made);
        sg_diag_add(diag, "internal error: out of memory");
        return SG_EXIT_INTERNAL;
    }
    size_t swapped = 0;
    for (size_t i = 0; i < n; i++)
        st[i].locks[0] = st[i].locks[1] = -1;
    for (size_t i = 0; i < n && status == SG_EXIT_OK; i++)
        if (stage(&outs[i], &st[i], made, diag) != 0)
            status = SG_EXIT_ERROR;
    for (; swapped < n && status == SG_EXIT_OK; swapped++)
        if (swap_in(&st[swapped], diag) != 0)
            status = SG_EXIT_ERROR;
    if (status != SG_EXIT_OK)
        while (swapped > 0)
            swap_back(&st[--swapped]);
    /* What is left beside the targets is either the new trees (failure) or
     * the old ones (success): both go. An old tree that cannot be deleted is
     * said so: the output is in place, but the old one takes the room. */
    for (size_t i = 0; i < n; i++) {
        for (int k = 0; k < 2; k++) {
            const char *left = k ? st[i].old : st[i].tmp;
            int err = remove_tree(left);
            if (err != 0 && status == SG_EXIT_OK)
                sg_diag_add(diag, "warning: %s was written, but its previous contents could not all be deleted: "
                            "they are left in %s (%s)", st[i].target, left, strerror(err));
        }
        for (int k = 0; k < 2; k++)
            if (st[i].locks[k] >= 0)
                close(st[i].locks[k]);
    }
    if (status != SG_EXIT_OK)
        for (int i = made->count - 1; i >= 0; i--)
            rmdir(made->paths[i]);
    free(st);
    free(made);
    return status;
}
