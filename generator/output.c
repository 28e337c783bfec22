/* output.c: writing generated variants to disk, all or nothing. Each output
 * directory is built complete in a fresh sibling (out/.NAME.tmp-XXXXXX) and
 * then swapped into place with one rename (an atomic exchange where the
 * kernel offers it), so a reader sees the old directory or the new one, never
 * a mix, and any failure before the swap leaves every target as it was. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sg.h"
#include "../runtime/json.h" /* the runtime's JSON reader, compiled into symmgen too */

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
} staged;

/* Parent directories this run created, removed again on failure. */
typedef struct created_dirs {
    char paths[16][PATH_MAX];
    int count;
} created_dirs;

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void remove_tree(const char *path)
{
    if (path[0])
        nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
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

/* The root of a manifest symmgen wrote: a JSON object with "format": 1 and a
 * "symmgen" version string. NULL (and why) for any other text. */
static const symm_json *our_manifest(const char *text, size_t len, symm_json_doc **doc, char *why,
                                     size_t why_size)
{
    int line = 0, col = 0;
    char err[128] = "";
    int rc = symm_json_parse(text, len, doc, &line, &col, err, sizeof err);
    if (rc != SYMM_JSON_OK) {
        *doc = NULL;
        if (rc == SYMM_JSON_NOMEM)
            snprintf(why, why_size, "manifest.json: out of memory reading it");
        else
            snprintf(why, why_size, "manifest.json is not JSON: line %d, column %d: %s", line, col, err);
        return NULL;
    }
    const symm_json *root = symm_json_root(*doc);
    const symm_json *format = symm_json_member(root, "format", NULL);
    const symm_json *version = symm_json_member(root, "symmgen", NULL);
    if (root && root->type == SYMM_JSON_OBJECT && format && format->type == SYMM_JSON_NUMBER &&
        format->is_int && format->integer == SG_MANIFEST_FORMAT && version &&
        version->type == SYMM_JSON_STRING)
        return root;
    snprintf(why, why_size, "manifest.json is not a symmgen manifest: expected an object with "
             "\"format\": %d and a \"symmgen\" version string", SG_MANIFEST_FORMAT);
    return NULL;
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The files a manifest lists ("files" of every variant, and itself), sorted;
 * NULL when out of memory. */
static const char **listed_files(const symm_json *manifest, size_t *count)
{
    const symm_json *variants = symm_json_member(manifest, "variants", NULL);
    size_t cap = 1;
    for (const symm_json *v = variants && variants->type == SYMM_JSON_ARRAY ? variants->first : NULL; v; v = v->next) {
        const symm_json *files = symm_json_member(v, "files", NULL);
        cap += files && files->type == SYMM_JSON_OBJECT ? files->count : 0;
    }
    const char **names = malloc(cap * sizeof *names);
    if (!names)
        return NULL;
    size_t n = 0;
    names[n++] = "manifest.json";
    for (const symm_json *v = variants && variants->type == SYMM_JSON_ARRAY ? variants->first : NULL; v; v = v->next) {
        const symm_json *files = symm_json_member(v, "files", NULL);
        for (const symm_json *f = files && files->type == SYMM_JSON_OBJECT ? files->first : NULL; f; f = f->next)
            if (f->type == SYMM_JSON_STRING && strlen(f->str) == f->len)
                names[n++] = f->str;
    }
    qsort(names, n, sizeof *names, compare_names);
    *count = n;
    return names;
}

/* Every entry of dir is a regular file that the manifest lists. */
static bool only_listed_files(const char *dir, const symm_json *manifest, char *why, size_t why_size)
{
    size_t n = 0;
    const char **names = listed_files(manifest, &n);
    DIR *d = names ? opendir(dir) : NULL;
    if (!d) {
        snprintf(why, why_size, "cannot list it: %s", names ? strerror(errno) : "out of memory");
        free(names);
        return false;
    }
    bool ok = true;
    for (struct dirent *e; ok && (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char path[PATH_MAX];
        struct stat st;
        const char *name = e->d_name;
        snprintf(path, sizeof path, "%s/%s", dir, name);
        ok = lstat(path, &st) == 0 && S_ISREG(st.st_mode) && bsearch(&name, names, n, sizeof *names, compare_names);
        if (!ok)
            snprintf(why, why_size, "it holds %s, which symmgen did not write", name);
    }
    closedir(d);
    free(names);
    return ok;
}

/* A directory symmgen wrote and nothing else touched: the whole directory is
 * replaced, so anything in it that is not ours would be lost. */
static bool looks_ours(const char *dir, char *why, size_t why_size)
{
    size_t len = 0;
    char *text = read_manifest(dir, &len, why, why_size);
    if (!text)
        return false;
    symm_json_doc *doc = NULL;
    const symm_json *manifest = our_manifest(text, len, &doc, why, why_size);
    free(text);
    bool ours = manifest && only_listed_files(dir, manifest, why, why_size);
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

int sg_output_check_target(const char *dir, sg_diag *diag)
{
    struct stat st;
    if (lstat(dir, &st) != 0) {
        if (errno == ENOENT)
            return SG_EXIT_OK;
        sg_diag_add(diag, "%s: %s", dir, strerror(errno));
        return SG_EXIT_ERROR;
    }
    char why[PATH_MAX + 128] = "";
    if (S_ISLNK(st.st_mode))
        snprintf(why, sizeof why, "a symbolic link");
    else if (!S_ISDIR(st.st_mode))
        snprintf(why, sizeof why, "not a directory");
    else if (dir_is_empty(dir) || looks_ours(dir, why, sizeof why))
        return SG_EXIT_OK;
    sg_diag_add(diag, "%s exists and is not a symmgen output directory (%s): refusing to replace it; "
                "nothing was written", dir, why);
    return SG_EXIT_ERROR;
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

/* A fresh, hidden directory beside the target: PARENT/.BASE.KIND-XXXXXX. */
static int make_sibling(char *out, const char *parent, const char *base, const char *kind, sg_diag *diag)
{
    int n = snprintf(out, PATH_MAX, "%s/.%s.%s-XXXXXX", parent, base, kind);
    if (n < 0 || n >= PATH_MAX || !mkdtemp(out)) {
        sg_diag_add(diag, "cannot create a directory beside %s/%s: %s", parent, base,
                    n < 0 || n >= PATH_MAX ? "path too long" : strerror(errno));
        out[0] = '\0';
        return -1;
    }
    return 0;
}

/* Build o's tree in a fresh directory beside its target. */
static int stage(const sg_output *o, staged *s, created_dirs *made, sg_diag *diag)
{
    char parent[PATH_MAX], base[PATH_MAX];
    if (split_target(o->dir, s->target, parent, base, diag) != 0)
        return -1;
    if (make_parents(parent, made, diag) != 0)
        return -1;
    if (make_sibling(s->tmp, parent, base, "tmp", diag) != 0)
        return -1;
    if (chmod(s->tmp, DIR_MODE) != 0) {
        sg_diag_add(diag, "%s: %s", s->tmp, strerror(errno));
        return -1;
    }
    return write_tree(o, s->tmp, diag);
}

static bool unsupported(int err) { return err == EINVAL || err == ENOSYS || err == ENOTSUP; }

/* Put s's new tree in place of its target, keeping the old tree to restore. */
static int swap_in(staged *s, sg_diag *diag)
{
    if (sg_output_check_target(s->target, diag) != SG_EXIT_OK)
        return -1;
    struct stat st;
    bool exists = lstat(s->target, &st) == 0;
    if (!exists) {
        if (renameat2(AT_FDCWD, s->tmp, AT_FDCWD, s->target, RENAME_NOREPLACE) == 0 ||
            (unsupported(errno) && rename(s->tmp, s->target) == 0)) {
            s->swap = SWAP_CREATED;
            return 0;
        }
    } else if (renameat2(AT_FDCWD, s->tmp, AT_FDCWD, s->target, RENAME_EXCHANGE) == 0) {
        s->swap = SWAP_EXCHANGED;
        return 0;
    } else if (unsupported(errno)) {
        /* No atomic exchange here: move the old tree aside (onto an empty
         * directory of ours), then the new one in. */
        char parent[PATH_MAX], base[PATH_MAX], target[PATH_MAX];
        if (split_target(s->target, target, parent, base, diag) != 0)
            return -1;
        if (make_sibling(s->old, parent, base, "old", diag) != 0)
            return -1;
        if (rename(s->target, s->old) == 0) {
            if (rename(s->tmp, s->target) == 0) {
                s->swap = SWAP_MOVED_ASIDE;
                return 0;
            }
            int saved = errno;
            /* Should the old tree not go back, it stays where it is, whole. */
            if (rename(s->old, s->target) != 0)
                s->old[0] = '\0';
            errno = saved;
        }
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
    for (size_t i = 0; i < n; i++)
        if (sg_output_check_target(outs[i].dir, diag) != SG_EXIT_OK)
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
     * the old ones (success): both go. */
    for (size_t i = 0; i < n; i++) {
        remove_tree(st[i].tmp);
        remove_tree(st[i].old);
    }
    if (status != SG_EXIT_OK)
        for (int i = made->count - 1; i >= 0; i--)
            rmdir(made->paths[i]);
    free(st);
    free(made);
    return status;
}
