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

#define FILE_MODE 0644
#define DIR_MODE 0755
/* How much of an existing manifest.json is read to recognise our own. */
#define MANIFEST_PROBE 4096

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

static bool manifest_looks_ours(const char *dir)
{
    char path[PATH_MAX], text[MANIFEST_PROBE + 1];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f)
        return false;
    size_t n = fread(text, 1, MANIFEST_PROBE, f);
    fclose(f);
    text[n] = '\0';
    return strstr(text, "\"format\"") != NULL;
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
    const char *why = NULL;
    if (S_ISLNK(st.st_mode))
        why = "a symbolic link";
    else if (!S_ISDIR(st.st_mode))
        why = "not a directory";
    else if (!manifest_looks_ours(dir) && !dir_is_empty(dir))
        why = "no manifest.json";
    if (!why)
        return SG_EXIT_OK;
    sg_diag_add(diag, "%s exists and is not a symmgen output directory (%s): refusing to replace it",
                dir, why);
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
