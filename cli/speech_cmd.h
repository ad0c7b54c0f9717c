/*
 * speech_cmd.h - `zinfer decode-speech`: a speech codec decoder file's
 * waveform for a sequence of codec codes (model_worker/wavtokenizer.h),
 * written as a WAV file, so that the decoder can be checked and used by
 * itself.
 */
#ifndef ZI_SPEECH_CMD_H
#define ZI_SPEECH_CMD_H

/* argv[0] is "decode-speech". Returns the process exit status. */
int zi_decode_speech_main(int argc, char **argv);

#endif
