/**
 * @file heap.c
 * @brief Negative test of the no-heap check: a program that calls malloc/free. It is built
 *        without the check (selftest=heap) and codegen.elfcheck.check_no_heap must reject it.
 */
#include "colibri_platform.h"

#include <stddef.h>
#include <stdlib.h>

void *_sbrk(ptrdiff_t increment);

/* newlib's malloc needs _sbrk to link; this one has no memory to give. */
void *_sbrk(ptrdiff_t increment)
{
    (void)increment;
    return (void *)-1;
}

int main(int argc, char **argv)
{
    (void)argv;
    clb_platform_init();
    char *p = malloc((size_t)argc + 15u);
    if (p == NULL) {
        return 1;
    }
    p[0] = 'x';
    int r = p[0] == 'x' ? 0 : 2;
    free(p);
    return r;
}
