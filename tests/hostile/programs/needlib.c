/* The real shared library behind burn -DNEEDLIB (found through LD_LIBRARY_PATH; the binary's own
 * DT_RUNPATH $ORIGIN holds a FIFO of the same name). */
volatile unsigned long needlib_ticks;

void needlib_tick(void)
{
    needlib_ticks++;
}
