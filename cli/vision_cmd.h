/*
 * vision_cmd.h - `zinfer encode-image`: a projector file's soft tokens for
 * an image, written as float32 (the image tower alone, model_worker/vision.h).
 */
#ifndef ZI_VISION_CMD_H
#define ZI_VISION_CMD_H

/* argv[0] is "encode-image". Returns the process exit status. */
int zi_encode_image_main(int argc, char **argv);

#endif
